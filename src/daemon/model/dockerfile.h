#pragma once
/*
 * Dockerfiles (docs/images.md): the text a client sends becomes a typed
 * list of steps, each with the line it starts on. What the builder does not
 * do is refused here by name with its line (an instruction, a flag, a
 * heredoc, ADD from a URL or of an archive), never passed over: an image
 * built without a step the author wrote would be wrong quietly.
 *
 * Variables ($NAME, ${NAME}, ${NAME:-word}, ${NAME:+word}) are kept as
 * written; the build expands them with dockerfile_expand once it knows the
 * ARG and ENV values in force at each step, as Docker does.
 *
 * Pure: logs nothing, keeps nothing; bounded in bytes, steps and words, so
 * that any text a client sends is parsed in bounded memory
 * (tests/fuzz/fuzz_dockerfile.c).
 */
#include <stdbool.h>
#include <stddef.h>

#define DOCKERFILE_MAX_BYTES (256u * 1024u)
#define DOCKERFILE_MAX_STEPS 512u
#define DOCKERFILE_MAX_WORDS 1024u /* of one step */
#define DOCKERFILE_MAX_STAGES 32u
/* An expanded word: what one variable substitution may grow to. */
#define DOCKERFILE_MAX_EXPANDED (64u * 1024u)
/* RUN --mount=type=secret flags of one step, and a secret's id and path. */
#define DOCKERFILE_MAX_SECRETS 16u
#define DOCKERFILE_SECRET_ID_MAX 64u
#define DOCKERFILE_SECRET_TARGET_MAX 255u

typedef enum DockerfileOp {
        DF_FROM,
        DF_RUN,
        DF_COPY,
        DF_ADD,
        DF_ENV,
        DF_ARG,
        DF_WORKDIR,
        DF_USER,
        DF_LABEL,
        DF_CMD,
        DF_ENTRYPOINT,
        DF_EXPOSE,
        DF_HEALTHCHECK,
} DockerfileOp;

/* RUN --mount=type=secret,id=ID[,target=PATH][,env=VAR][,required=BOOL]
 * (BuildKit's build secrets, docs/images.md): the value is the build
 * request's, present only while this step runs. */
typedef struct DockerfileSecret {
        char *id;     /* [A-Za-z0-9_.-]{1,64}; without id=, target's last part */
        char *target; /* an absolute path; NULL: env only */
        char *env;    /* a variable's name; NULL: none */
        bool required;
} DockerfileSecret;

typedef struct DockerfileStep {
        DockerfileOp op;
        unsigned line; /* 1-based: the line the instruction starts on */
        unsigned stage; /* the index of the FROM it follows (a FROM: its own) */
        /* The step's words, unquoted but not expanded:
         * FROM: the image; RUN, CMD, ENTRYPOINT: the shell form's one command
         * line, or the exec form's argv (exec true); COPY, ADD: the sources,
         * then the destination; ENV, LABEL: name, value, name, value...;
         * ARG: name, then the default or NULL (n_words 2); WORKDIR, USER: one;
         * EXPOSE: the ports; HEALTHCHECK: its CMD's words as CMD's (none:
         * NONE). */
        char **words;
        size_t n_words;
        bool exec;
        char *as;    /* FROM ... AS name; NULL: none */
        char *from;  /* COPY --from: a stage's name or index, or an image; NULL: the context */
        bool from_image; /* COPY --from names no earlier stage: an image (a built-in one or the owner's) */
        char *chown; /* COPY/ADD --chown=user[:group]; NULL: root */
        char *chmod; /* COPY/ADD --chmod=octal; NULL: the file's own */
        DockerfileSecret *secrets; /* RUN --mount=type=secret, in order */
        size_t n_secrets;
} DockerfileStep;

typedef struct Dockerfile {
        DockerfileStep *steps;
        size_t n_steps;
        unsigned n_stages;
} Dockerfile;

typedef struct DockerfileError {
        unsigned line; /* 0: the whole file */
        char message[256];
} DockerfileError;

const char *dockerfile_op_name(DockerfileOp op);

/* Parses len bytes of text into *ret. 0, or -EINVAL with e filled (the line
 * and what is wrong, naming the instruction or flag refused), -E2BIG past a
 * bound, -ENOMEM. */
int dockerfile_parse(const char *text, size_t len, Dockerfile *ret, DockerfileError *e);
void dockerfile_done(Dockerfile *d);

/* The stage named (its AS name, or its index in decimal): its index, or -1. */
int dockerfile_stage(const Dockerfile *d, const char *name);

/* Expands $NAME, ${NAME}, ${NAME:-word} and ${NAME:+word} in word with
 * lookup's values (NULL: unset, expanding to ""); "\$" is a literal "$".
 * A new string in *ret; -EINVAL for a ${ without its }, or a modifier other
 * than :- and :+ (named in e), -E2BIG past DOCKERFILE_MAX_EXPANDED. */
typedef const char *(*DockerfileLookupFn)(void *userdata, const char *name);
int dockerfile_expand(const char *word, DockerfileLookupFn lookup, void *userdata, char **ret, DockerfileError *e);

/* A COPY source or destination inside the build context: cleaned of ".",
 * empty and leading "/" parts, ".." applied; -EPERM when ".." leaves the
 * context. "" is the context's root. A new string in *ret. */
int dockerfile_context_path(const char *path, char **ret);
