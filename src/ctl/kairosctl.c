/* SPDX-License-Identifier: MIT */
/* kairosctl: the operator's tool.  main() takes the global options (before
 * or after the command), finds the command in the dispatch table and runs it.
 * To add a command: one row in `commands` and one ctl_command_fn. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"

struct ctl_command {
        const char *name;       /* one or more words, e.g. "wal dump" */
        ctl_command_fn fn;      /* NULL: declared, not implemented yet */
        bool online;            /* talks to kairosd over the control socket */
        const char *usage;      /* arguments, for --help */
        const char *help;       /* what it does, for "help CMD" and "CMD --help" */
};

static int cmd_help(const struct ctl_opts *o, int argc, char **argv);

static const struct ctl_command commands[] = {
        /* online (control socket) */
        { "status", ctl_cmd_status, true, "",
          "The daemon's version, pid, uptime and state, its state directory and\n"
          "configuration, mandates per status and the summary of the last recovery." },
        { "schedules", ctl_cmd_schedules, true, "",
          "Every configured schedule: cron expression, time zone, next and last fire,\n"
          "missed-tick policy, concurrency and state." },
        { "schedules next", ctl_cmd_schedules_next, true, "NAME [-n N]",
          "The next N fire times (default 5, at most 1000) of schedule NAME, in UTC\n"
          "and in the schedule's time zone." },
        { "list", ctl_cmd_list, true,
          "[--status S] [--schedule N] [--since T] [--limit N] [--after MANDATE] [--state-dir DIR]",
          "Mandates, newest first: id, schedule, fired at, status, cycle, started, ended,\n"
          "duration and the reason or the step under review.  --status, --schedule and\n"
          "--since T (YYYY-MM-DDTHH:MM:SSZ or 30min, 2h, 7d ago) filter; --limit N rows\n"
          "(default 1000, 0: all); --after MANDATE: the page after that row.\n"
          "--state-dir DIR: read the state directory, without kairosd." },
        { "show", ctl_cmd_show, true, "MANDATE [--state-dir DIR]",
          "One mandate: status, reason, schedule, times, plan, cycle, its WAL, each plan\n"
          "with its steps (start, end, duration), the operator actions, and the retries\n"
          "linked to it.  MANDATE: an id or any unique prefix of one.  --state-dir DIR:\n"
          "read the state directory, without kairosd." },
        { "retry", ctl_cmd_retry, true, "MANDATE [--reason T] [--from STEP]",
          "Run a mandate that ended again: a new mandate for the same schedule and tick\n"
          "(id from NAME|FIRED_AT|retry:N).  Refused while MANDATE has not ended; a\n"
          "mandate that ended done needs --reason.  --from STEP (a step id such as\n"
          "act_001, or a phase: its step in the last cycle): the steps of its cycle\n"
          "before STEP are taken as completed with their results, and it runs from STEP." },
        { "wait", ctl_cmd_wait, true, "MANDATE [--timeout S]",
          "Wait until a mandate ends or waits for an operator.  Exit 0 done, 1 ended\n"
          "otherwise, 4 paused for an operator, 124 timed out after S seconds." },
        { "fire", ctl_cmd_fire, true, "SCHEDULE [--at TIME]",
          "Fire a schedule now, or for the tick TIME (UTC, YYYY-MM-DDTHH:MM:SSZ).\n"
          "Firing the same tick again does nothing." },
        { "backfill", ctl_cmd_backfill, true, "SCHEDULE --from TIME --to TIME [--dry-run] [--max N]",
          "Fire the schedule's ticks in [--from, --to] (UTC), oldest first, each like\n"
          "fire --at (a tick already fired is not fired again); --dry-run lists them.\n"
          "At most 100 ticks unless --max N (at most 10000)." },
        { "pause", ctl_cmd_pause, true, "MANDATE [--reason T] | --schedule NAME [--reason T]",
          "Pause a mandate (a running handler finishes, no further step starts), or\n"
          "with --schedule a schedule (it does not fire on its own until resumed)." },
        { "resume", ctl_cmd_resume, true, "MANDATE | --schedule NAME",
          "Resume a mandate paused by an operator, or a paused schedule." },
        { "approve", ctl_cmd_approve, true, "MANDATE [--reason T]",
          "Let a mandate that awaits approval go on." },
        { "cancel", ctl_cmd_cancel, true, "MANDATE --reason T",
          "End a mandate that has not ended as cancelled: a running handler gets\n"
          "SIGTERM, SIGKILL 5 s later; its step is recorded failed (cancelled)." },
        { "resolve", ctl_cmd_resolve, true, "MANDATE STEP --done|--retry|--abandon --reason T",
          "Decide a step that recovery paused for review: --done (its effect happened),\n"
          "--retry (safe to run again), --abandon (end the mandate abandoned)." },
        { "reload", ctl_cmd_reload, true, "",
          "Re-read and validate the configuration and schedules (like SIGHUP); on an\n"
          "error the daemon keeps the running configuration." },
        { "metrics", ctl_cmd_metrics, true, "[--openmetrics]",
          "kairosd's metrics in the Prometheus text format (the format of MetricsFile=),\n"
          "or with --openmetrics in OpenMetrics 1.0." },
        { "tool run", ctl_cmd_tool_run, true, "--key K [--tool NAME] [--check CHECK] -- CMD ARGS...",
          "For handlers: run CMD at most once per key; a duplicate replays the stored\n"
          "exit status, output and error. --check CHECK: the command line recovery\n"
          "runs to ask whether CMD took effect when a crash cut the call off." },
        { "tool write", ctl_cmd_tool_write, true, "--key K PATH",
          "For handlers: the daemon writes standard input to PATH atomically, at most\n"
          "once per key, only inside its WriteRoots=." },
        { "idem stats", ctl_cmd_idem_stats, true, "",
          "Statistics of the idempotency store." },
        { "idem get", ctl_cmd_idem_get, true, "KEY",
          "One entry of the idempotency store (KEY as TOOL:K, or K alone)." },
        { "idem forget", ctl_cmd_idem_forget, true, "KEY --reason T",
          "Remove an entry of the idempotency store so that the key runs again." },
        /* offline (no daemon) */
        { "help", cmd_help, false, "[CMD]",
          "The commands, or the usage of command CMD." },
        { "wal dump", ctl_cmd_wal_dump, false,
          "FILE | --db CONNINFO|@FILE [--output FILE] MANDATE",
          "Print a WAL (plain or gzip-compressed, e.g. an archive) one record per line.\n"
          "With --db: write MANDATE's rows of cluster mode's PostgreSQL database as\n"
          "the WAL file they stand for, byte for byte, to standard output or --output\n"
          "FILE.  Exit 65 if the rows have a gap, 66 no connection or no such mandate.\n"
          "CONNINFO must not hold a password (anyone can read a command line): use\n"
          "~/.pgpass, PGPASSFILE, PGPASSWORD, or @FILE (the string read from FILE)." },
        { "wal verify", ctl_cmd_wal_verify, false, "FILE... | --db CONNINFO|@FILE MANDATE...",
          "Check WAL files (plain or gzip-compressed).  Exit 0 all clean, 1 a torn\n"
          "tail, 2 corruption (also a damaged gzip file), 66 a file cannot be read.\n"
          "With --db: check MANDATE's rows in cluster mode's PostgreSQL database (each\n"
          "row a sealed record with its crc, seq 1..last_seq without a gap, epochs\n"
          "never going back along seq); exit 2 a bad row (its seq is printed), 66 no\n"
          "connection or no such mandate.  CONNINFO as for wal dump." },
        { "recover", ctl_cmd_recover, false,
          "--dry-run [--state-dir D] [--config PATH] [--probe]",
          "Show what recovery would decide for every WAL in D/wal (default: the\n"
          "configuration's StateDirectory=, else " CTL_DEFAULT_STATE_DIR ") with the\n"
          "evidence kairosd would use: PATH's schedules (default\n"
          "/etc/kairos/kairosd.conf if it exists) and the idempotency log, read\n"
          "offline; shows the steps a probe would decide, and with --probe runs\n"
          "those probes and decides with their word; changes nothing." },
        { "canon", ctl_cmd_canon, false, "[--hash] [FILE|-]",
          "Print the canonical JSON of a document, or with --hash its hash." },
        { "plan", ctl_cmd_plan, false, "--name N --fired-at T [--cycle C] [--retry R]",
          "Print the plan kairosd would write for schedule N fired at T (cycle C,\n"
          "default 1; with --retry R, of retry R of that tick: kairosctl retry)." },
        { "cron next", ctl_cmd_cron_next, false, "EXPR [--from T] [-n N] [--tz Z]",
          "The next N fire times of a cron expression after T, in time zone Z." },
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_help(void)
{
        printf("Usage: kairosctl [--socket PATH] [--json] COMMAND [ARGS...]\n"
               "\n"
               "The operator's tool for kairosd, the crash-safe job daemon.\n"
               "\n"
               "Global options (before or after the command):\n"
               "  --socket PATH   control socket [$KAIROS_CONTROL_SOCKET or " CTL_DEFAULT_SOCKET "]\n"
               "  --json          machine-readable output\n"
               "  --help          this help\n"
               "  --version       print the version\n");
        for (int pass = 0; pass < 2; pass++) {
                bool online = pass == 0;
                printf("\n%s\n", online ? "Commands (need the daemon):"
                                        : "Offline commands (no daemon needed):");
                for (size_t i = 0; i < N_COMMANDS; i++) {
                        if (commands[i].online != online)
                                continue;
                        printf("  %s%s%s\n", commands[i].name, *commands[i].usage ? " " : "",
                               commands[i].usage);
                }
        }
        printf("\nExit status: 0 success, 64 usage error, 65 bad input data, 66 unreadable\n"
               "file (--db: no database or mandate), 74 writing the output failed; wal\n"
               "verify: 1 torn tail, 2 corruption; commands that need the daemon: 1 the\n"
               "daemon refused, 2 the daemon cannot be reached; wait: 1 ended other\n"
               "than done, 4 paused for an operator, 124 timed out.\n"
               "\"kairosctl help CMD\" or \"kairosctl CMD --help\": the usage of one command.\n"
               "Environment: KAIROS_CONTROL_SOCKET (socket path), KAIROSCTL_TIMEOUT (seconds\n"
               "to wait for the daemon, default 30).\n");
}

static void print_command_help(const struct ctl_command *c)
{
        printf("Usage: kairosctl [--socket PATH] [--json] %s%s%s\n\n%s\n", c->name,
               *c->usage ? " " : "", c->usage, c->help);
        printf("\n%s\nSee kairosctl(1).\n",
               c->online ? "Needs the daemon (the control socket)." : "Needs no daemon.");
}

/* Number of words of `name` if they equal argv[0..], else 0. */
static int match_words(const char *name, int argc, char **argv)
{
        int words = 0;
        const char *p = name;

        while (*p) {
                size_t n = strcspn(p, " ");
                if (words >= argc || strlen(argv[words]) != n || strncmp(argv[words], p, n) != 0)
                        return 0;
                words++;
                p += n;
                p += strspn(p, " ");
        }
        return words;
}

static const struct ctl_command *find_command(int argc, char **argv, int *words)
{
        const struct ctl_command *best = NULL;

        *words = 0;
        for (size_t i = 0; i < N_COMMANDS; i++) {
                int w = match_words(commands[i].name, argc, argv);
                if (w > *words) {
                        *words = w;
                        best = &commands[i];
                }
        }
        return best;
}

/* help [CMD]: the overview, the usage of CMD, or of every subcommand of a
 * group ("help wal"). */
static int cmd_help(const struct ctl_opts *o, int argc, char **argv)
{
        const struct ctl_command *c;
        int words;
        bool any = false;

        (void)o;
        if (argc == 0) {
                print_help();
                return CTL_EXIT_OK;
        }
        c = find_command(argc, argv, &words);
        if (c) { /* "show MANDATE --help" is the help of show */
                print_command_help(c);
                return CTL_EXIT_OK;
        }
        if (argc == 1) {
                size_t len = strlen(argv[0]);
                for (size_t i = 0; i < N_COMMANDS; i++) {
                        if (strncmp(commands[i].name, argv[0], len) != 0 ||
                            commands[i].name[len] != ' ')
                                continue;
                        if (any)
                                putchar('\n');
                        print_command_help(&commands[i]);
                        any = true;
                }
                if (any)
                        return CTL_EXIT_OK;
        }
        fputs("kairosctl: help: unknown command '", stderr);
        for (int i = 0; i < argc; i++) {
                if (i)
                        fputc(' ', stderr);
                ctl_put_safe(stderr, argv[i]);
        }
        fputs("' (see kairosctl help)\n", stderr);
        return CTL_EXIT_USAGE;
}

/* "wal" alone or "wal frob": name the known subcommands. */
static int unknown_command(int argc, char **argv)
{
        char subs[256] = "";
        size_t len = strlen(argv[0]);

        for (size_t i = 0; i < N_COMMANDS; i++) {
                const char *name = commands[i].name;
                if (strncmp(name, argv[0], len) == 0 && name[len] == ' ') {
                        size_t used = strlen(subs);
                        snprintf(subs + used, sizeof(subs) - used, "%s%s", used ? ", " : "",
                                 name + len + 1);
                }
        }
        if (*subs) {
                if (argc < 2)
                        return ctl_usage_error("%s needs a subcommand (%s)", argv[0], subs);
                return ctl_usage_error("%s: unknown subcommand '%s' (%s)", argv[0], argv[1],
                                       subs);
        }
        return ctl_usage_error("unknown command '%s'", argv[0]);
}

/* Take the global options out of argv (up to a "--"), compacting the rest
 * in place.  Returns -1 to continue, else an exit status. */
static int parse_global(int *argc, char **argv, struct ctl_opts *o, bool *help)
{
        int out = 1;
        bool version = false;

        for (int i = 1; i < *argc; i++) {
                const char *a = argv[i];
                if (strcmp(a, "--") == 0) {
                        while (i < *argc)
                                argv[out++] = argv[i++];
                        break;
                }
                if (strcmp(a, "--json") == 0) {
                        o->json = true;
                } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
                        *help = true;
                } else if (strcmp(a, "--version") == 0) {
                        version = true;
                } else if (strcmp(a, "--socket") == 0) {
                        if (i + 1 >= *argc)
                                return ctl_usage_error("--socket needs a PATH");
                        o->socket_path = argv[++i];
                } else if (strncmp(a, "--socket=", 9) == 0) {
                        o->socket_path = a + 9;
                } else {
                        argv[out++] = argv[i];
                }
        }
        *argc = out;
        argv[out] = NULL;
        if (o->socket_path && !*o->socket_path)
                return ctl_usage_error("--socket needs a non-empty PATH");
        if (version && !*help) {
                printf("kairosctl %s\n", KAIROS_VERSION);
                return CTL_EXIT_OK;
        }
        return -1;
}

static int finish(int status)
{
        if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "kairosctl: writing the output failed\n");
                if (status == CTL_EXIT_OK)
                        return CTL_EXIT_IOERR;
        }
        return status;
}

int main(int argc, char **argv)
{
        struct ctl_opts o = { .socket_path = NULL, .json = false };
        const struct ctl_command *cmd;
        int words, r;
        bool help = false;

        r = parse_global(&argc, argv, &o, &help);
        if (r >= 0)
                return finish(r);
        if (help) /* "--help", or "CMD --help": that command's usage */
                return finish(cmd_help(&o, argc - 1, argv + 1));
        if (argc < 2)
                return ctl_usage_error("no command given");
        if (argv[1][0] == '-' && argv[1][1] != '\0' && strcmp(argv[1], "--") != 0)
                return ctl_usage_error("unknown option '%s'", argv[1]);

        cmd = find_command(argc - 1, argv + 1, &words);
        if (!cmd)
                return unknown_command(argc - 1, argv + 1);
        if (!cmd->fn)
                return ctl_not_implemented(cmd->name, cmd->online);
        return finish(cmd->fn(&o, argc - 1 - words, argv + 1 + words));
}
