#pragma once
/*
 * The seccomp policy of a sandbox (namespace driver): default allow, and
 * EPERM (ENOSYS where a caller should fall back) for what a sandbox never
 * needs. docs/drivers.md lists the calls and why.
 */
#include <stddef.h>
#include <stdint.h>

/* Builds the filter for the native architecture and writes it as a classic
 * BPF program to a new memfd, positioned at 0, O_CLOEXEC: what
 * `bwrap --seccomp FD` reads. The program is built once per process. */
int seccomp_policy_export_fd(int *ret_fd);
/* The same program as raw bytes (static storage; do not free). */
int seccomp_policy_bpf(const uint8_t **ret_prog, size_t *ret_len);
