#pragma once
/*
 * Image recipes and inline files (docs/images.md, "Recipes and inline
 * files"). A recipe ({base, env, workdir, apt, files, pip, npm, commands})
 * becomes the text of a Dockerfile the builder runs as any other, its steps
 * in one fixed order; inline files ([{path, content, encoding?, mode?}],
 * a recipe's or a Dockerfile's) become the build's context, a tar archive
 * made here.
 *
 * Everything is the client's and so hostile: every item is checked before
 * anything is made, and refused naming its field and index. A package is
 * a name its tool takes (never an option: nothing starts with "-", and the
 * tools are told where their options end), passed as one argument of an
 * exec-form RUN, so no shell reads it; only the recipe's own `commands` go
 * to a shell. A file's path is relative, without "..", and normalized;
 * counts and sizes are bounded.
 *
 * Pure: logs nothing, keeps nothing (tests/fuzz/fuzz_image_recipe.c).
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define IMAGE_FILES_MAX 1000u
#define IMAGE_FILES_BYTES (8u * 1024u * 1024u) /* decoded, all files together */
#define IMAGE_FILE_PATH_MAX 1024u
#define IMAGE_RECIPE_PACKAGES_MAX 256u /* of each of apt, pip and npm */
#define IMAGE_RECIPE_PACKAGE_LEN 512u
#define IMAGE_RECIPE_COMMANDS_MAX 256u
#define IMAGE_RECIPE_COMMAND_LEN 16384u
#define IMAGE_RECIPE_ENV_MAX 256u
#define IMAGE_RECIPE_ENV_VALUE_LEN 16384u
#define IMAGE_RECIPE_WORKDIR_DEFAULT "/workspace"
#define IMAGE_RECIPE_BASE_DEFAULT "default"

typedef struct ImageFile {
        char *path; /* normalized: relative, no "", "." or ".." part */
        uint8_t *data;
        size_t len;
        unsigned mode; /* 0644 unless given; never setuid, setgid or sticky */
} ImageFile;

typedef struct ImageFiles {
        ImageFile *v; /* sorted by path */
        size_t n;
        uint64_t bytes;
} ImageFiles;

typedef struct ImageRecipe {
        char *dockerfile; /* the text made */
        /* What the image's record keeps: the recipe as given, its files'
         * contents as their size and SHA-256. */
        json_t *record;
        ImageFiles files;
        /* The recipe's field each line of the text comes from (line i+1:
         * fields[i]), to name it when the Dockerfile's parser refuses it. */
        char **fields;
        size_t n_fields;
} ImageRecipe;

/* The wire's files (field names them in why: "files", "recipe.files") into
 * *ret. 0; -EINVAL with why (what the client sees); -ENOMEM. */
int image_files_parse(const json_t *v, const char *field, ImageFiles *ret, char *why, size_t why_len);
void image_files_done(ImageFiles *f);
/* The files as a plain tar (their directories first, each made 0755),
 * the same bytes for the same files: a malloc'ed buffer. -ENOMEM. */
int image_files_archive(const ImageFiles *f, uint8_t **ret, size_t *ret_len);
/* [{path, size, sha256, mode}] of the files (a new reference), or NULL. */
json_t *image_files_summary(const ImageFiles *f);

/* The wire's recipe into *ret. 0; -EINVAL with why; -ENOMEM. */
int image_recipe_parse(const json_t *v, ImageRecipe *ret, char *why, size_t why_len);
void image_recipe_done(ImageRecipe *r);
/* The recipe's field that line (1-based) of its Dockerfile comes from:
 * "recipe.pip" and the like; "recipe" when none. */
const char *image_recipe_field_of_line(const ImageRecipe *r, unsigned line);
