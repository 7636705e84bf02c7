/* test_dist_crash.c - kill one rank of `mpirun -np 2 kiln cache build --tp 2`
 * with SIGKILL at random moments (mpirun then ends the other): every shard
 * folder of the key is afterwards either absent or complete and verified,
 * never partial; a later run completes both shards. Runs as a plain test
 * that starts mpirun itself (fork + exec at once: no OpenMP in the child). */
#include "base/base.h"
#include "cache/cache.h"
#include "test.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t spawn_build(const char *model, const char *root) {
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", 1);
        if (devnull >= 0) dup2(devnull, 1), dup2(devnull, 2);
        execlp("mpirun", "mpirun", "--oversubscribe", "-np", "2", getenv("KILN_BIN"), "cache", "build", model,
               "--cache-dir", root, "--name", "crash", "--tp", "2", "--dtype", "f32", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* the pids of mpirun's children that run kiln (the ranks) */
static int ranks_of(pid_t parent, pid_t *out, int cap) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) && n < cap) {
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *close_paren = strrchr(buf, ')');
        int ppid = 0;
        if (close_paren && sscanf(close_paren + 2, "%*c %d", &ppid) == 1 && ppid == parent && strstr(buf, "(kiln)"))
            out[n++] = (pid_t)atoi(e->d_name);
    }
    if (d) closedir(d);
    return n;
}

/* every shard folder under the key folders of root: complete or absent */
static int check_no_partial(const char *root, int *complete, int *staging) {
    char group[700];
    snprintf(group, sizeof group, "%s/crash/transformer", root);
    DIR *d = opendir(group);
    int bad = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".lock") || strstr(e->d_name, ".staging.") ||
            strstr(e->d_name, ".trash."))
            continue;
        char key[1000];
        snprintf(key, sizeof key, "%s/%s", group, e->d_name);
        DIR *k = opendir(key);
        struct dirent *s;
        while (k && (s = readdir(k))) {
            if (strncmp(s->d_name, "shard_", 6)) continue;
            if (strstr(s->d_name, ".staging.")) {
                (*staging)++;
                continue;
            }
            if (strstr(s->d_name, ".lock") || strstr(s->d_name, ".trash.")) continue;
            char p[1300];
            snprintf(p, sizeof p, "%s/%s", key, s->d_name);
            kcache_entry *ce = NULL;
            if (kcache_open(p, 1, &ce) == KILN_OK) {
                (*complete)++;
                kcache_close(ce);
            } else {
                fprintf(stderr, "  partial shard folder %s: %s\n", p, kiln_last_error());
                bad++;
            }
        }
        if (k) closedir(k);
    }
    if (d) closedir(d);
    return bad;
}

/* the pid in a shard's staging folder name (<shard>.staging.<pid>.<n>), or 0 */
static pid_t publishing_pid(const char *root) {
    char group[700];
    snprintf(group, sizeof group, "%s/crash/transformer", root);
    DIR *d = opendir(group);
    struct dirent *e;
    pid_t pid = 0;
    while (d && !pid && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strstr(e->d_name, ".lock") || strstr(e->d_name, ".staging.") ||
            strstr(e->d_name, ".trash."))
            continue;
        char key[1000];
        snprintf(key, sizeof key, "%s/%s", group, e->d_name);
        DIR *k = opendir(key);
        struct dirent *s;
        while (k && !pid && (s = readdir(k))) {
            const char *st = strstr(s->d_name, ".staging.");
            if (!strncmp(s->d_name, "shard_", 6) && st) pid = (pid_t)atoi(st + 9);
        }
        if (k) closedir(k);
    }
    if (d) closedir(d);
    return pid;
}

/* waitpid on mpirun, at most `seconds`: Open MPI's mpirun now and then
 * misses a rank killed early and never exits; then it and its ranks are
 * killed here (returns 0), so the trial's cache is still checked */
static int wait_bounded(pid_t mp, int *status, int seconds) {
    for (int w = 0; w < seconds * 100; w++) {
        if (waitpid(mp, status, WNOHANG) == mp) return 1;
        usleep(10000);
    }
    pid_t r[4];
    int n = ranks_of(mp, r, 4);
    for (int i = 0; i < n; i++) kill(r[i], SIGKILL);
    kill(mp, SIGKILL);
    waitpid(mp, status, 0);
    return 0;
}

TEST(kill_a_rank_during_publish) {
    char dir[512], model[600], root[600];
    test_tmpdir(dir, sizeof dir, "dist-crash");
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(root, sizeof root, "%s/cache", dir);
    kiln_config c = kiln_config_demo();
    c.attention_head_dim = 64; /* D = 256: megabytes per shard, a publish window worth hitting */
    c.caption_projection_dim = c.joint_attention_dim = 256;
    c.num_layers = 6;
    CHECK_OK(kiln_write_seeded_model(model, &c, 11, KILN_F32));
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int trials = 8, killed = 0, staging_seen = 0;
    for (int t = 0; t < trials; t++) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root); /* every trial starts from a miss */
        if (system(cmd) != 0) break;
        pid_t mp = spawn_build(model, root);
        /* even trials: kill a random rank after a random 0..400 ms once both run;
         * odd trials: kill the rank whose staging folder just appeared */
        pid_t r[4], victim = 0;
        int n = 0;
        for (int w = 0; w < 400 && (n = ranks_of(mp, r, 4)) < 2; w++) usleep(10000);
        if (t % 2 == 0) {
            usleep((useconds_t)(rand() % 400) * 1000);
            if (n >= 1) victim = r[rand() % n];
        } else {
            for (int w = 0; w < 20000 && !victim && waitpid(mp, NULL, WNOHANG) == 0; w++) {
                victim = publishing_pid(root);
                if (!victim) usleep(500);
            }
        }
        if (victim && kill(victim, SIGKILL) == 0) killed++;
        int status = 0;
        if (!wait_bounded(mp, &status, 60)) fprintf(stderr, "  trial %d: mpirun hung after the kill; killed it\n", t);
        int complete = 0, staging = 0;
        CHECK_MSG(check_no_partial(root, &complete, &staging) == 0, "trial %d left a partial shard", t);
        staging_seen += staging > 0;
        fprintf(stderr, "  trial %d: mpirun exit %d, %d complete shard%s, %d staging leftover%s\n", t,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1, complete, complete == 1 ? "" : "s", staging,
                staging == 1 ? "" : "s");
    }
    CHECK(killed > 0);
    /* a clean run afterwards publishes both shards */
    pid_t mp = spawn_build(model, root);
    int status = 0;
    CHECK_MSG(wait_bounded(mp, &status, 300), "the final build did not end in 5 minutes");
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "final build: status %d", status);
    int complete = 0, staging = 0;
    CHECK(check_no_partial(root, &complete, &staging) == 0);
    CHECK_MSG(complete == 2, "%d complete shards after a clean run", complete);
    fprintf(stderr, "  %d of %d trials killed a rank; %d caught a publish in its staging folder\n", killed, trials,
            staging_seen);
    test_rmrf(dir);
}

int main(void) {
    if (!getenv("KILN_BIN")) {
        fprintf(stderr, "KILN_BIN is not set (CTest sets it)\n");
        return 2;
    }
    RUN(kill_a_rank_during_publish);
    return TEST_SUMMARY();
}
