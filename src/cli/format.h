#pragma once
/* Human output: tables for lists, "key: value" lines for one object. Every
 * string that came from the daemon is printed with control characters
 * replaced, so a sandbox name cannot drive the terminal. `now` is a
 * parameter so the output of a given object is reproducible. */
#include <jansson.h>
#include <stdio.h>
#include <time.h>

/* "2026-11-30T09:00:00Z" (fractional seconds and +hh:mm offsets accepted). */
int rfc3339_parse(const char *s, time_t *ret);

/* "45s", "12m", "3h12m", "2d3h". */
void format_span(char *buf, size_t len, long long seconds);
/* "5m ago", "in 4m", or "-" for a missing or unreadable time. */
void format_relative(char *buf, size_t len, const char *rfc3339, time_t now);
/* "$0.031250". */
void format_money(char *buf, size_t len, long long micros);
/* A string from the daemon, control characters replaced, padded to width. */
void format_put_safe(FILE *f, const char *s, int width);
/* "512 B", "1.5 KiB", "270.3 MiB". */
void format_bytes(char *buf, size_t len, long long bytes);

void format_sandbox_table(FILE *f, json_t *sandboxes, time_t now);
void format_sandbox_detail(FILE *f, json_t *sandbox, time_t now);
void format_image_table(FILE *f, json_t *images);
void format_file_entries(FILE *f, json_t *entries);
