#include "cli/generate.h"

#include <errno.h>
#include <string.h>

/* The global options, as print_global_help says them. */
static const char *const global_options[] = {"--url", "--key", "--json", "--help", "--version"};

/* Text for roff: hyphens as "\-", backslashes as "\e". */
static void roff(FILE *f, const char *text) {
        for (const char *p = text; *p; p++) {
                if (*p == '\\')
                        fputs("\\e", f);
                else if (*p == '-')
                        fputs("\\-", f);
                else
                        fputc(*p, f);
        }
}

void cli_generate_man(FILE *f, const Command *commands) {
        fprintf(f, ".TH RUNTIME 1 \"\" \"runtime %s\" \"User Commands\"\n", RUNTIME_VERSION);
        fputs(".SH NAME\n"
              "runtime \\- the command\\-line client of runtimed: secure sandboxes for AI agents\n"
              ".SH SYNOPSIS\n"
              ".B runtime\n"
              "[\\fB\\-\\-url\\fR \\fIURL\\fR] [\\fB\\-\\-key\\fR \\fIKEY\\fR] [\\fB\\-\\-json\\fR]\n"
              "\\fICOMMAND\\fR ...\n"
              ".SH DESCRIPTION\n"
              ".B runtime\n"
              "drives a \\fBruntimed\\fR(8) over its HTTP API: it creates sandboxes, runs commands and\n"
              "moves files in them, and manages keys, secrets and images.\n"
              "\\fBruntime\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR shows a command's own options.\n"
              ".SH GLOBAL OPTIONS\n"
              ".TP\n\\fB\\-\\-url\\fR \\fIURL\\fR\n"
              "the daemon: http://HOST:PORT or unix:/path/to/socket (default: $RUNTIME_BASE_URL, else\n"
              "http://127.0.0.1:7878).\n"
              ".TP\n\\fB\\-\\-key\\fR \\fIKEY\\fR\n"
              "the API key (default: $RUNTIME_API_KEY, else admin.key in the state directory).\n"
              ".TP\n\\fB\\-\\-json\\fR\n"
              "print the API's JSON instead of tables.\n"
              ".TP\n\\fB\\-\\-help\\fR\n"
              "the help; \\fBruntime\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR for a command's.\n"
              ".TP\n\\fB\\-\\-version\\fR\n"
              "print the version.\n"
              ".SH COMMANDS\n",
              f);
        for (const Command *c = commands; c->name; c++) {
                if (!c->subcommands) {
                        fputs(".TP\n\\fBruntime ", f);
                        roff(f, c->name);
                        fputs("\\fR\n", f);
                        roff(f, c->summary);
                        fputs(".\n", f);
                        continue;
                }
                fputs(".SS ", f);
                roff(f, c->name);
                fputs(": ", f);
                roff(f, c->summary);
                fputc('\n', f);
                for (const Command *s = c->subcommands; s->name; s++) {
                        fputs(".TP\n\\fBruntime ", f);
                        roff(f, c->name);
                        fputc(' ', f);
                        roff(f, s->name);
                        fputs("\\fR\n", f);
                        roff(f, s->summary);
                        fputs(".\n", f);
                }
        }
        fputs(".SH EXIT STATUS\n"
              "0 success, 1 error, 2 usage error; \\fBsandbox run\\fR and \\fBsandbox exec\\fR pass the\n"
              "command's own code on, 124 when it timed out, 130 when interrupted.\n"
              ".SH ENVIRONMENT\n"
              ".TP\n.B RUNTIME_BASE_URL\n"
              "the daemon's URL.\n"
              ".TP\n.B RUNTIME_API_KEY\n"
              "the API key.\n"
              ".TP\n.B RUNTIME_STATE_DIR\n"
              "where admin.key is looked for when no key is given.\n"
              ".SH SEE ALSO\n"
              "\\fBruntimed\\fR(8), \\fBruntimed.conf\\fR(5)\n",
              f);
}

static void words(FILE *f, const Command *table) {
        for (const Command *c = table; c->name; c++)
                fprintf(f, "%s%s", c == table ? "" : " ", c->name);
}

static void bash_completion(FILE *f, const Command *commands) {
        fputs("# bash completion for runtime, made from its command table (runtime --completion bash)\n"
              "_runtime() {\n"
              "    local cur prev i group=\"\" sub=\"\"\n"
              "    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
              "    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
              "    case \"$prev\" in --url|--key) return 0 ;; esac\n"
              "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
              "        case \"${COMP_WORDS[i]}\" in\n"
              "            --url|--key) ((i++)) ;;\n"
              "            -*) ;;\n"
              "            *) if [ -z \"$group\" ]; then group=\"${COMP_WORDS[i]}\"; "
              "elif [ -z \"$sub\" ]; then sub=\"${COMP_WORDS[i]}\"; fi ;;\n"
              "        esac\n"
              "    done\n"
              "    if [ -z \"$group\" ]; then\n"
              "        if [[ \"$cur\" == -* ]]; then\n"
              "            COMPREPLY=($(compgen -W \"",
              f);
        for (size_t i = 0; i < sizeof global_options / sizeof *global_options; i++)
                fprintf(f, "%s%s", i ? " " : "", global_options[i]);
        fputs("\" -- \"$cur\"))\n"
              "        else\n"
              "            COMPREPLY=($(compgen -W \"",
              f);
        words(f, commands);
        fputs(" help version\" -- \"$cur\"))\n"
              "        fi\n"
              "        return 0\n"
              "    fi\n"
              "    [ -z \"$sub\" ] || { [[ \"$cur\" == -* ]] && COMPREPLY=($(compgen -W \"--help\" -- \"$cur\")); "
              "return 0; }\n"
              "    case \"$group\" in\n",
              f);
        for (const Command *c = commands; c->name; c++) {
                if (!c->subcommands)
                        continue;
                fprintf(f, "        %s) COMPREPLY=($(compgen -W \"", c->name);
                words(f, c->subcommands);
                fputs(" help\" -- \"$cur\")) ;;\n", f);
        }
        fputs("    esac\n"
              "    return 0\n"
              "}\n"
              "complete -F _runtime runtime\n",
              f);
}

/* A summary in single quotes for zsh's _describe: a quote closes, is
 * escaped and reopens; a colon separates name and text, so it is escaped. */
static void zsh_item(FILE *f, const char *name, const char *summary) {
        fprintf(f, "        '%s:", name);
        for (const char *p = summary; *p; p++) {
                if (*p == '\'')
                        fputs("'\\''", f);
                else if (*p == ':')
                        fputs("\\:", f);
                else
                        fputc(*p, f);
        }
        fputs("'\n", f);
}

static void zsh_completion(FILE *f, const Command *commands) {
        fputs("#compdef runtime\n"
              "# zsh completion for runtime, made from its command table (runtime --completion zsh)\n"
              "_runtime() {\n"
              "    local -a words_left commands\n"
              "    local group=\"\" sub=\"\" i\n"
              "    for ((i = 2; i < CURRENT; i++)); do\n"
              "        case \"${words[i]}\" in\n"
              "            --url|--key) ((i++)) ;;\n"
              "            -*) ;;\n"
              "            *) if [[ -z $group ]]; then group=${words[i]}; "
              "elif [[ -z $sub ]]; then sub=${words[i]}; fi ;;\n"
              "        esac\n"
              "    done\n"
              "    case \"${words[CURRENT-1]}\" in --url|--key) _message 'value'; return ;; esac\n"
              "    if [[ -z $group ]]; then\n"
              "        if [[ ${words[CURRENT]} == -* ]]; then\n"
              "            compadd -- ",
              f);
        for (size_t i = 0; i < sizeof global_options / sizeof *global_options; i++)
                fprintf(f, "%s%s", i ? " " : "", global_options[i]);
        fputs("\n            return\n"
              "        fi\n"
              "        commands=(\n",
              f);
        for (const Command *c = commands; c->name; c++)
                zsh_item(f, c->name, c->summary);
        fputs("        )\n"
              "        _describe 'command' commands\n"
              "        return\n"
              "    fi\n"
              "    [[ -n $sub ]] && { compadd -- --help; return; }\n"
              "    case $group in\n",
              f);
        for (const Command *c = commands; c->name; c++) {
                if (!c->subcommands)
                        continue;
                fprintf(f, "    %s)\n        commands=(\n", c->name);
                for (const Command *s = c->subcommands; s->name; s++)
                        zsh_item(f, s->name, s->summary);
                fputs("        )\n        _describe 'command' commands ;;\n", f);
        }
        fputs("    esac\n"
              "}\n"
              "_runtime \"$@\"\n",
              f);
}

int cli_generate_completion(FILE *f, const char *shell, const Command *commands) {
        if (strcmp(shell, "bash") == 0)
                bash_completion(f, commands);
        else if (strcmp(shell, "zsh") == 0)
                zsh_completion(f, commands);
        else
                return -EINVAL;
        return 0;
}
