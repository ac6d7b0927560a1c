#pragma once
/*
 * The `sudo` front: the agent binary run under the name sudo (the gateway
 * places it ahead of /usr/bin/sudo on PATH). It parses sudo's command line,
 * sends the command, its directory, the environment and its stdin, stdout
 * and stderr to the agent's gateway, relays the signals it receives and
 * ends as the command did. Runs as the caller, with nothing of the agent's.
 */

/* sudo's main: the process's exit status. */
int sudo_front_main(int argc, char **argv);
