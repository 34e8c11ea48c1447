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
};

static const struct ctl_command commands[] = {
        /* online (control socket) */
        { "status", ctl_cmd_status, true, "" },
        { "schedules", ctl_cmd_schedules, true, "" },
        { "schedules next", ctl_cmd_schedules_next, true, "NAME [-n N]" },
        { "list", ctl_cmd_list, true, "" },
        { "show", ctl_cmd_show, true, "MANDATE" },
        { "fire", ctl_cmd_fire, true, "SCHEDULE [--at TIME]" },
        { "pause", ctl_cmd_pause, true, "MANDATE [--reason T] | --schedule NAME [--reason T]" },
        { "resume", ctl_cmd_resume, true, "MANDATE | --schedule NAME" },
        { "approve", ctl_cmd_approve, true, "MANDATE [--reason T]" },
        { "resolve", ctl_cmd_resolve, true, "MANDATE STEP --done|--retry|--abandon --reason T" },
        { "reload", ctl_cmd_reload, true, "" },
        { "tool run", ctl_cmd_tool_run, true, "--key K [--tool NAME] -- CMD ARGS..." },
        { "tool write", ctl_cmd_tool_write, true, "--key K PATH" },
        { "idem stats", ctl_cmd_idem_stats, true, "" },
        { "idem get", ctl_cmd_idem_get, true, "KEY" },
        { "idem forget", ctl_cmd_idem_forget, true, "KEY --reason T" },
        /* offline (no daemon) */
        { "wal dump", ctl_cmd_wal_dump, false, "FILE" },
        { "wal verify", ctl_cmd_wal_verify, false, "FILE..." },
        { "recover", ctl_cmd_recover, false, "--dry-run [--state-dir D]" },
        { "canon", ctl_cmd_canon, false, "[--hash] [FILE|-]" },
        { "plan", ctl_cmd_plan, false, "--name N --fired-at T [--cycle C]" },
        { "cron next", ctl_cmd_cron_next, false, "EXPR [--from T] [-n N] [--tz Z]" },
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
               "file; wal verify: 1 torn tail, 2 corruption; commands that need the daemon:\n"
               "1 the daemon refused, 2 the daemon cannot be reached.\n"
               "Environment: KAIROS_CONTROL_SOCKET (socket path), KAIROSCTL_TIMEOUT (seconds\n"
               "to wait for the daemon, default 30).\n");
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
static int parse_global(int *argc, char **argv, struct ctl_opts *o)
{
        int out = 1;
        bool help = false, version = false;

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
                        help = true;
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
        if (help) {
                print_help();
                return CTL_EXIT_OK;
        }
        if (version) {
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

        r = parse_global(&argc, argv, &o);
        if (r >= 0)
                return finish(r);
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
