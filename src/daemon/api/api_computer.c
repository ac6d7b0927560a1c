/* The browser and the desktop of a sandbox (docs/computer-use.md): Chromium
 * with its DevTools reached through the preview listener, and an X desktop
 * driven with xdotool. Each route runs one verb of the script below in the
 * sandbox, as an exec does, under the sandbox's own user; the programs it
 * starts are processes of the sandbox like any other, behind its egress
 * policy and its limits. */
#include "daemon/api/api_computer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base64.h"
#include "common/jsonutil.h"
#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/http/request.h"
#include "daemon/manager/previews.h"

/*
 * The program the routes run: one bash script, each route one of its
 * verbs, run as `bash -c SCRIPT runtime-computer VERB ARGS...`. What a
 * client sent (text to type, a URL, argv) reaches it as positional
 * arguments only, never inside the script's text, and numbers only after
 * the handler checked them. Its exit status says what went wrong
 * (COMPUTER_EXIT_*), its standard output the answer or the detail.
 *
 * State inside the sandbox: the X server on display :99, its window
 * manager, Chromium with DevTools on 127.0.0.1:9222, x11vnc on
 * 127.0.0.1:5900 and noVNC on 127.0.0.1:6080; pid files and logs in
 * /tmp/.runtime-desktop and /tmp/.runtime-browser (mode 0700).
 */
#define COMPUTER_EXIT_MISSING 10    /* a program the verb needs is not in the image (its name) */
#define COMPUTER_EXIT_NOT_RUNNING 11 /* the desktop or the browser is not running */
#define COMPUTER_EXIT_OFF_SCREEN 12  /* a coordinate past the screen ("W H") */
#define COMPUTER_EXIT_BAD_KEY 13     /* a key name X does not know (the name) */
#define COMPUTER_EXIT_START 14       /* a program exited at its start (its log's tail) */
#define COMPUTER_EXIT_NO_WINDOW 15   /* no such window */
#define COMPUTER_EXIT_BUSY 16        /* a recording runs already (its id) */
#define COMPUTER_EXIT_NO_SPACE 17    /* the sandbox's disk has no room for a recording */
#define COMPUTER_EXIT_NO_RECORDING 18 /* no such recording */

/* The port of Chromium's DevTools and of the live view, on the sandbox's
 * loopback. */
#define COMPUTER_CDP_PORT 9222
#define COMPUTER_VIEW_PORT 6080

static const char computer_script[] =
        "set -u -f\n"
        "S=/tmp/.runtime-desktop B=/tmp/.runtime-browser\n"
        "export DISPLAY=:99\n"
        "missing() { for c in \"$@\"; do command -v \"$c\" >/dev/null 2>&1 || { echo \"$c\"; exit 10; }; done; }\n"
        "alive() { [ -f \"$1\" ] && kill -0 \"$(cat \"$1\")\" 2>/dev/null; }\n"
        /* Detached in a session of its own: the exec that started it ends,
         * the program stays. */
        "spawn() { local pidf=$1 log=$2; shift 2; setsid \"$@\" </dev/null >\"$log\" 2>&1 9>&- & echo $! >\"$pidf\"; }\n"
        "tries() { local n=$1; shift; while [ \"$n\" -gt 0 ]; do \"$@\" && return 0; sleep 0.1; n=$((n - 1)); done; return 1; }\n"
        "stop_pid() { alive \"$1\" || { rm -f \"$1\"; return 1; }; local p; p=$(cat \"$1\")\n"
        "  kill -TERM -- -\"$p\" 2>/dev/null || kill -TERM \"$p\" 2>/dev/null\n"
        "  tries 30 eval '! kill -0 '\"$p\"' 2>/dev/null' || kill -KILL -- -\"$p\" 2>/dev/null; rm -f \"$1\"; }\n"
        "x_up() { xdpyinfo >/dev/null 2>&1; }\n"
        "need_x() { command -v xdpyinfo >/dev/null 2>&1 && x_up || { echo desktop; exit 11; }; }\n"
        "onscreen() { local w h; read -r w h < <(xdotool getdisplaygeometry)\n"
        "  [ \"$1\" -lt \"$w\" ] && [ \"$2\" -lt \"$h\" ] || { echo \"$w $h\"; exit 12; }; }\n"
        /* -noreset: an X server resets when its last client leaves, and a
         * client connecting during the reset fails (xdpyinfo's probe is
         * the first to leave). */
        "desktop_up() {\n"
        "  missing Xvfb openbox xdotool xdpyinfo wmctrl\n"
        "  mkdir -p -m 0700 \"$S\"\n"
        "  x_up && return 0\n"
        "  rm -f /tmp/.X99-lock /tmp/.X11-unix/X99\n"
        "  spawn \"$S/xvfb.pid\" \"$S/xvfb.log\" Xvfb :99 -screen 0 \"${1}x${2}x24\" -nolisten tcp -noreset\n"
        "  tries 100 x_up || { echo \"the X server did not start: $(tail -c 300 \"$S/xvfb.log\")\"; exit 14; }\n"
        "  spawn \"$S/wm.pid\" \"$S/wm.log\" openbox\n"
        "  tries 50 eval 'wmctrl -m >/dev/null 2>&1' || { echo \"the window manager did not start: $(tail -c 300 \"$S/wm.log\")\"; exit 14; }\n"
        "}\n"
        "view_up() {\n"
        "  command -v x11vnc >/dev/null 2>&1 && command -v websockify >/dev/null 2>&1 && [ -d /usr/share/novnc ] || return 0\n"
        "  alive \"$S/vnc.pid\" || spawn \"$S/vnc.pid\" \"$S/vnc.log\" x11vnc -display :99 -localhost -rfbport 5900 -forever -shared -nopw -quiet\n"
        "  alive \"$S/novnc.pid\" || spawn \"$S/novnc.pid\" \"$S/novnc.log\" websockify --web /usr/share/novnc 127.0.0.1:6080 127.0.0.1:5900\n"
        "  echo view\n"
        "}\n"
        "cdp_path() { curl -sf --noproxy '*' --max-time 2 http://127.0.0.1:9222/json/version |\n"
        "  sed -n 's|.*\"webSocketDebuggerUrl\": *\"ws://[^/]*\\(/devtools/browser/[0-9a-fA-F-]*\\)\".*|\\1|p' | grep .; }\n"
        /* Chromium refuses a DevTools request, WebSocket or not, whose Host
         * is neither an address nor a localhost name, and the preview
         * listener passes the client's Host (PORT-sbx-HEX.DOMAIN) through.
         * DevTools listens on 9223; this relay on 9222 puts "localhost" in
         * the first head of a connection whose Host is another name, and
         * leaves a localhost name as it is (Chromium then names its
         * WebSocket at the listener's address). */
        "RELAY=$(cat <<'PY'\n"
        "import ipaddress, socket, threading\n"
        "def local(h):\n"
        "    h = h.strip().lower()\n"
        "    if h.startswith(b'['): h = h[1:h.find(b']')]\n"
        "    elif h.count(b':') == 1: h = h.split(b':')[0]\n"
        "    try:\n"
        "        ipaddress.ip_address(h.decode()); return True\n"
        "    except ValueError:\n"
        "        return h == b'localhost' or h.endswith(b'.localhost')\n"
        "def pipe(a, b):\n"
        "    try:\n"
        "        while True:\n"
        "            d = a.recv(65536)\n"
        "            if not d: break\n"
        "            b.sendall(d)\n"
        "    except OSError: pass\n"
        "    for x in (a, b):\n"
        "        try: x.shutdown(socket.SHUT_RDWR)\n"
        "        except OSError: pass\n"
        "def serve(c, slots):\n"
        "    try:\n"
        "        head = b''\n"
        "        while b'\\r\\n\\r\\n' not in head and len(head) < 65536:\n"
        "            d = c.recv(65536)\n"
        "            if not d: return\n"
        "            head += d\n"
        "        h, sep, rest = head.partition(b'\\r\\n\\r\\n')\n"
        "        lines = h.split(b'\\r\\n')\n"
        "        for i, l in enumerate(lines[1:], 1):\n"
        "            k, _, v = l.partition(b':')\n"
        "            if k.strip().lower() == b'host' and not local(v.strip()):\n"
        "                lines[i] = b'Host: localhost'\n"
        "        u = socket.create_connection(('127.0.0.1', 9223))\n"
        "        u.sendall(b'\\r\\n'.join(lines) + sep + rest)\n"
        "        threading.Thread(target=pipe, args=(u, c), daemon=True).start()\n"
        "        pipe(c, u)\n"
        "    except OSError: pass\n"
        "    finally:\n"
        "        c.close(); slots.release()\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 9222)); s.listen(64)\n"
        "slots = threading.BoundedSemaphore(64)\n"
        "while True:\n"
        "    c, _ = s.accept(); slots.acquire()\n"
        "    threading.Thread(target=serve, args=(c, slots), daemon=True).start()\n"
        "PY\n"
        ")\n"
        /* --no-sandbox: Chromium's own sandbox needs user namespaces, which
         * the sandbox's seccomp filter refuses; the sandbox is the
         * boundary. DevTools listens on the sandbox's loopback only. */
        "browser_up() { local headless=$1 w=$2 h=$3; shift 3\n"
        "  mkdir -p -m 0700 \"$B\"\n"
        "  set -- --no-sandbox --no-first-run --no-default-browser-check --disable-dev-shm-usage --disable-gpu \\\n"
        "    --disable-breakpad --password-store=basic --disable-background-networking --disable-component-update \\\n"
        "    --disable-sync --disable-default-apps --no-pings --remote-debugging-address=127.0.0.1 --remote-debugging-port=9223 \\\n"
        "    --user-data-dir=\"$B/profile\" --window-position=0,0 --window-size=\"$w,$h\" \"$@\"\n"
        "  [ -n \"${HTTPS_PROXY:-${https_proxy:-}}\" ] && set -- --proxy-server=\"${HTTPS_PROXY:-${https_proxy:-}}\" \"$@\"\n"
        "  if [ \"$headless\" = 1 ]; then set -- --headless=new \"$@\"; else desktop_up \"$w\" \"$h\"; fi\n"
        "  echo \"$headless\" >\"$B/headless\"\n"
        "  stop_pid \"$B/relay.pid\" || true; spawn \"$B/relay.pid\" \"$B/relay.log\" python3 -c \"$RELAY\"\n"
        "  spawn \"$B/pid\" \"$B/log\" chromium \"$@\"\n"
        "  tries 200 eval 'alive \"$B/pid\" && cdp_path >/dev/null' ||\n"
        "    { stop_pid \"$B/pid\"; echo \"Chromium did not start: $(tail -c 400 \"$B/log\")\"; exit 14; }\n"
        "}\n"
        "verb=$1; shift\n"
        /* Starts and stops one at a time per sandbox: two starts at once
         * would each find nothing running and start a second Chromium.
         * What they spawn does not keep the lock (9>&- above). */
        "case $verb in *-start | *-stop | open) exec 9>>/tmp/.runtime-computer.lock; flock -w 60 9 || { echo \"another start or stop did not finish\"; exit 14; } ;; esac\n"
        "case $verb in\n"
        "browser-start)\n"
        "  missing chromium curl\n"
        "  if alive \"$B/pid\" && p=$(cdp_path); then echo \"$p $(cat \"$B/headless\")\"; exit 0; fi\n"
        "  stop_pid \"$B/pid\" || true\n"
        "  browser_up \"$1\" \"$2\" \"$3\" about:blank\n"
        "  [ \"$1\" = 1 ] || view_up >/dev/null\n"
        "  echo \"$(cdp_path) $1\" ;;\n"
        "browser-get)\n"
        "  alive \"$B/pid\" && p=$(cdp_path) || { [ -f \"$B/pid\" ] && tail -c 300 \"$B/log\"; exit 11; }\n"
        "  echo \"$p $(cat \"$B/headless\")\" ;;\n"
        "browser-stop)\n"
        "  stop_pid \"$B/relay.pid\" || true; if stop_pid \"$B/pid\"; then echo 1; else echo 0; fi ;;\n"
        "desktop-start)\n"
        "  desktop_up \"$1\" \"$2\"\n"
        "  v=$(view_up); echo \"$(xdotool getdisplaygeometry) ${v:-noview}\" ;;\n"
        "desktop-stop)\n"
        "  was=0; [ -f \"$B/headless\" ] && [ \"$(cat \"$B/headless\")\" = 0 ] && stop_pid \"$B/pid\"\n"
        "  stop_pid \"$S/desktop-browser.pid\" || true\n"
        "  for f in novnc vnc wm xvfb; do stop_pid \"$S/$f.pid\" && was=1; done; echo $was ;;\n"
        "screenshot)\n"
        "  need_x; missing ffmpeg base64\n"
        "  if [ \"$1\" = png ]; then set -- -c:v png; else set -- -c:v mjpeg -q:v \"$2\"; fi\n"
        "  ffmpeg -nostdin -loglevel error -f x11grab -i :99 -frames:v 1 \"$@\" -f image2pipe - | base64 -w0 ;;\n"
        "move) need_x; onscreen \"$1\" \"$2\"; xdotool mousemove -- \"$1\" \"$2\" ;;\n"
        "click) need_x; if [ \"$1\" != - ]; then onscreen \"$1\" \"$2\"; xdotool mousemove -- \"$1\" \"$2\"; fi\n"
        "  xdotool click --repeat \"$4\" \"$3\" ;;\n"
        "mousedown) need_x; xdotool mousedown \"$1\" ;;\n"
        "mouseup) need_x; xdotool mouseup \"$1\" ;;\n"
        "drag) need_x; onscreen \"$1\" \"$2\"; onscreen \"$3\" \"$4\"\n"
        "  xdotool mousemove -- \"$1\" \"$2\" mousedown 1 sleep 0.05 mousemove -- \"$3\" \"$4\" sleep 0.05 mouseup 1 ;;\n"
        "scroll) need_x; if [ \"$3\" != - ]; then onscreen \"$3\" \"$4\"; xdotool mousemove -- \"$3\" \"$4\"; fi\n"
        "  dy=$1 dx=$2\n"
        "  [ \"$dy\" -gt 0 ] && xdotool click --repeat \"$dy\" 5; [ \"$dy\" -lt 0 ] && xdotool click --repeat $((-dy)) 4\n"
        "  [ \"$dx\" -gt 0 ] && xdotool click --repeat \"$dx\" 7; [ \"$dx\" -lt 0 ] && xdotool click --repeat $((-dx)) 6; true ;;\n"
        "type) need_x; xdotool type --delay \"$2\" -- \"$1\" ;;\n"
        /* Every name is looked up as xdotool will (XStringToKeysym after
         * its own aliases) before any key is pressed: an unknown one is
         * refused whole, not skipped. */
        "key) need_x\n"
        "  python3 - \"$1\" <<'PY' || exit 13\n"
        "import ctypes, sys\n"
        "x = ctypes.CDLL('libX11.so.6'); x.XStringToKeysym.restype = ctypes.c_ulong; x.XStringToKeysym.argtypes = [ctypes.c_char_p]\n"
        "alias = {'alt': 'Alt_L', 'ctrl': 'Control_L', 'control': 'Control_L', 'meta': 'Meta_L', 'super': 'Super_L', 'shift': 'Shift_L'}\n"
        "for combo in sys.argv[1].split():\n"
        "    for name in combo.split('+'):\n"
        "        if not name.isdigit() and not x.XStringToKeysym(alias.get(name.lower(), name).encode()):\n"
        "            print(name); sys.exit(1)\n"
        "PY\n"
        "  xdotool key --clearmodifiers -- $1 ;;\n"
        "cursor) need_x; eval \"$(xdotool getmouselocation --shell)\"; echo \"$X $Y\" ;;\n"
        "windows) need_x; echo \"active $(xdotool getactivewindow 2>/dev/null || echo 0)\"; wmctrl -lpG ;;\n"
        "focus) need_x\n"
        "  for w in $(wmctrl -l | awk '{print $1}'); do if [ $((w)) = $(($1)) ]; then wmctrl -i -a \"$w\"; exit 0; fi; done\n"
        "  exit 15 ;;\n"
        "open) need_x\n"
        "  case $1 in\n"
        "  /*) missing xdg-open; spawn \"$S/open.pid\" \"$S/open.log\" xdg-open \"$1\" ;;\n"
        "  *) missing chromium\n"
        "     if alive \"$B/pid\" && [ \"$(cat \"$B/headless\")\" = 0 ]; then chromium --user-data-dir=\"$B/profile\" \"$1\" >/dev/null 2>&1 9>&-\n"
        "     elif alive \"$B/pid\"; then\n"
        "       alive \"$S/desktop-browser.pid\" && chromium --user-data-dir=\"$S/profile\" \"$1\" >/dev/null 2>&1 9>&- ||\n"
        "         spawn \"$S/desktop-browser.pid\" \"$S/desktop-browser.log\" chromium --no-sandbox --no-first-run \\\n"
        "           --no-default-browser-check --disable-dev-shm-usage --disable-gpu --password-store=basic \\\n"
        "           --user-data-dir=\"$S/profile\" ${HTTPS_PROXY:+--proxy-server=$HTTPS_PROXY} \"$1\"\n"
        "     else read -r w h < <(xdotool getdisplaygeometry); browser_up 0 \"$w\" \"$h\" \"$1\"; fi ;;\n"
        "  esac ;;\n"
        "launch) need_x; command -v \"$1\" >/dev/null 2>&1 || { echo \"$1\"; exit 10; }\n"
        "  mkdir -p -m 0700 \"$S\"; setsid \"$@\" </dev/null >>\"$S/launch.log\" 2>&1 9>&- & echo $! ;;\n"
        /* Recordings: $S/rec/ID.mp4, its ffmpeg's pid and a line of
         * "FPS MAX_SECONDS MAX_MIB STARTED" (Unix seconds). ffmpeg stops
         * itself at -t and -fs; -fs is capped below the disk's free room
         * so that a recording never fills it. */
        "rec-start) set +f; need_x; missing ffmpeg; mkdir -p -m 0700 \"$S/rec\"\n"
        "  for f in \"$S\"/rec/*.pid; do [ -e \"$f\" ] && alive \"$f\" && { basename \"$f\" .pid; exit 16; }; done\n"
        "  room=$(( $(df -Pk \"$S/rec\" | awk 'NR == 2 { print $4 }') / 1024 - 64 ))\n"
        "  mib=$4; [ \"$room\" -lt \"$mib\" ] && mib=$room; [ \"$mib\" -ge 1 ] || exit 17\n"
        "  echo \"$2 $3 $mib $(date +%s)\" >\"$S/rec/$1.meta\"\n"
        "  spawn \"$S/rec/$1.pid\" \"$S/rec/$1.log\" ffmpeg -nostdin -loglevel error -f x11grab -framerate \"$2\" -i :99 \\\n"
        "    -t \"$3\" -fs $((mib * 1048576)) -c:v libx264 -preset veryfast -crf \"$5\" -pix_fmt yuv420p \"$S/rec/$1.mp4\"\n"
        "  sleep 0.3; alive \"$S/rec/$1.pid\" || { echo \"ffmpeg exited: $(tail -c 300 \"$S/rec/$1.log\")\"; rm -f \"$S/rec/$1.mp4\" \"$S/rec/$1.meta\" \"$S/rec/$1.log\" \"$S/rec/$1.pid\"; exit 14; }\n"
        "  echo \"$1 recording $(cat \"$S/rec/$1.meta\") 0\" ;;\n"
        "rec-stop) [ -f \"$S/rec/$1.meta\" ] || exit 18\n"
        /* SIGINT: ffmpeg writes the MP4's index and exits. */
        "  if alive \"$S/rec/$1.pid\"; then p=$(cat \"$S/rec/$1.pid\"); kill -INT \"$p\"\n"
        "    tries 150 eval '! kill -0 '\"$p\"' 2>/dev/null' || kill -KILL \"$p\"; fi\n"
        "  rm -f \"$S/rec/$1.pid\"; set -- \"$1\"; ;&\n"
        "rec-get) [ -f \"$S/rec/$1.meta\" ] || exit 18\n"
        "  st=done; alive \"$S/rec/$1.pid\" && st=recording\n"
        "  echo \"$1 $st $(cat \"$S/rec/$1.meta\") $(stat -c %s \"$S/rec/$1.mp4\" 2>/dev/null || echo 0)\" ;;\n"
        "rec-list) set +f; for f in \"$S\"/rec/*.meta; do [ -e \"$f\" ] || continue; i=$(basename \"$f\" .meta)\n"
        "  st=done; alive \"$S/rec/$i.pid\" && st=recording\n"
        "  echo \"$i $st $(cat \"$f\") $(stat -c %s \"$S/rec/$i.mp4\" 2>/dev/null || echo 0)\"; done ;;\n"
        "rec-delete) [ -f \"$S/rec/$1.meta\" ] || exit 18\n"
        "  stop_pid \"$S/rec/$1.pid\" || true; rm -f \"$S/rec/$1.mp4\" \"$S/rec/$1.meta\" \"$S/rec/$1.log\" \"$S/rec/$1.pid\" ;;\n"
        "*) exit 2 ;;\n"
        "esac\n";

/* The screen a start makes when none is asked, and the bounds of one. */
#define SCREEN_DEFAULT_W 1280
#define SCREEN_DEFAULT_H 800
#define SCREEN_MIN_SIDE 64
#define SCREEN_MAX_W 3840
#define SCREEN_MAX_H 2160
/* Client-sent text: what to type, key names, a URL, a program's argv. */
#define TYPE_MAX_BYTES 4096
#define TYPE_MAX_DELAY_MS 1000
#define TYPE_MAX_MS 120000 /* the whole typing, text times delay */
#define KEYS_MAX_BYTES 256
#define URL_MAX_BYTES 4096
#define LAUNCH_MAX_ARGS 64
#define LAUNCH_MAX_ARG_BYTES 4096
#define SCROLL_MAX_CLICKS 100
#define CLICK_MAX_COORD 32767
/* A screenshot as base64: an exec's output bound (a 4K screen's PNG
 * stays well below its 12 MiB of image). */
#define SHOT_MAX_B64 REQ_MAX_OUTPUT
/* Starts wait for Chromium (up to 20 s in the script) and the X server. */
#define START_TIMEOUT_MS 60000
#define ACT_TIMEOUT_MS 20000
#define VERB_OUTPUT_MAX (64u * 1024u)
#define VERB_MAX_ARGS (LAUNCH_MAX_ARGS + 8)

/* The image whose sandboxes have all of it (images/build.sh). */
#define COMPUTER_IMAGE "desktop"

/* The sandbox's row: its image names the fix when a program is missing,
 * its driver whether a desktop can run there. */
static int sandbox_row(Req *r, SandboxRow *ret, ApiError *e) {
        SandboxError se;
        if (sandbox_get(r->app->manager, &r->key, r->route.sandbox_id, ret, &se) < 0)
                return api_sandbox_error(&se, e);
        return 0;
}

/* The microVM is left out: under the software emulation it runs with where
 * KVM does not boot a guest (these hosts), Chromium and the X server take
 * minutes to start, and the routes are untested there. Refused before
 * anything runs. */
static int driver_supported(Req *r, const char *what, ApiError *e) {
        SandboxRow row;
        int rc = sandbox_row(r, &row, e);
        if (rc < 0)
                return rc;
        bool microvm = row.spec.driver == SANDBOX_DRIVER_MICROVM;
        sandbox_row_done(&row);
        if (microvm)
                return api_error(e, 501, "not_implemented",
                                 "create the sandbox with driver \"namespace\" or \"gvisor\" and image \"" COMPUTER_IMAGE "\"",
                                 "the %s runs on the namespace and gvisor drivers, not on the microVM (not offered "
                                 "there: untested, and under emulation Chromium takes minutes to start)",
                                 what);
        return 0;
}

/* A verb's failure as the API's error; out is what the script said. */
static int verb_error(Req *r, int code, const char *out, const char *err, ApiError *e) {
        switch (code) {
        case COMPUTER_EXIT_MISSING: {
                SandboxRow row;
                int rc = sandbox_row(r, &row, e);
                if (rc < 0)
                        return rc;
                api_error(e, 409, "conflict", "create the sandbox with image \"" COMPUTER_IMAGE "\"",
                          "sandbox %s runs image \"%.64s\", which has no %.64s", r->route.sandbox_id,
                          row.spec.image ? row.spec.image : "default", out);
                sandbox_row_done(&row);
                return -ENOENT;
        }
        case COMPUTER_EXIT_NOT_RUNNING:
                /* -ESRCH: told apart from a sandbox that is not running. */
                if (strcmp(out, "desktop") == 0)
                        api_error(e, 409, "conflict", "start it: POST /v1/sandboxes/{id}/desktop:start",
                                  "the desktop of sandbox %s is not running", r->route.sandbox_id);
                else
                        api_error(e, 409, "conflict", "start it: POST /v1/sandboxes/{id}/browser:start",
                                  "the browser of sandbox %s is not running", r->route.sandbox_id);
                return -ESRCH;
        case COMPUTER_EXIT_OFF_SCREEN:
                return api_error(e, 400, "invalid_request", "coordinates are pixels from the top left, below the screen's size",
                                 "a point is off the screen (%.32s)", out);
        case COMPUTER_EXIT_BAD_KEY:
                return api_error(e, 400, "invalid_request", "X key names, as xdotool takes them: Return, ctrl+l, alt+Tab, F5",
                                 "unknown key name \"%.64s\"; no key was pressed", out);
        case COMPUTER_EXIT_START:
                return api_error(e, 503, "unavailable", "try again; its log is in the sandbox under /tmp/.runtime-*",
                                 "%.600s", out);
        case COMPUTER_EXIT_NO_WINDOW:
                return api_error(e, 404, "not_found", "list them: {\"action\": \"windows\"}", "no such window");
        case COMPUTER_EXIT_BUSY:
                return api_error(e, 409, "conflict", "stop it first: POST .../desktop/recordings/{id}:stop",
                                 "recording %.32s runs already: one at a time", out);
        case COMPUTER_EXIT_NO_SPACE:
                return api_error(e, 413, "payload_too_large", "free space in the sandbox, or create it with more diskMiB",
                                 "the sandbox's disk has no room for a recording");
        case COMPUTER_EXIT_NO_RECORDING:
                return api_error(e, 404, "not_found", "list them: GET .../desktop/recordings", "no recording %s",
                                 r->route.recording);
        default:
                log_error(r->rid, "computer verb on %s exited %d: %.300s", r->route.sandbox_id, code, err);
                return api_error(e, 500, "internal", NULL, "the desktop's command failed in the sandbox");
        }
}

int api_sandbox_script(Req *r, json_t *argv, int64_t timeout_ms, size_t max_out, char **ret_out, int *ret_exit,
                       ApiError *e) {
        _cleanup_json_ json_t *body = json_pack("{s:O,s:I,s:I}", "argv", argv, "timeoutMs", (json_int_t)timeout_ms,
                                                "maxOutputBytes", (json_int_t)max_out);
        if (!body)
                return -ENOMEM;
        ExecRequest q;
        int rc = request_parse_exec(body, &q, e);
        if (rc < 0)
                return rc;
        Sandbox *sb;
        rc = api_sandbox_acquire(r, &sb, e);
        if (rc < 0) {
                exec_request_done(&q);
                return rc;
        }
        _cleanup_json_ json_t *res = NULL;
        rc = api_exec_run(sb, &q, req_socket(r), r->rid, &res, e);
        exec_request_done(&q);
        if (rc == -EPIPE) /* the client left; the program was cancelled */
                return rc;
        if (rc < 0)
                return e->code ? rc : -ENOMEM;
        const char *out = json_string_value(json_object_get(res, "stdout"));
        const char *err = json_string_value(json_object_get(res, "stderr"));
        json_t *ec = json_object_get(res, "exitCode");
        if (json_is_true(json_object_get(res, "timedOut")) || !json_is_integer(ec))
                return api_error(e, 503, "unavailable", "try again", "the sandbox did not finish in time");
        if (json_is_true(json_object_get(res, "stdoutTruncated")))
                return api_error(e, 500, "internal", NULL, "the sandbox answered more than expected");
        *ret_exit = (int)json_integer_value(ec);
        if (*ret_exit != 0 && err && *err)
                log_error(r->rid, "a program in %s exited %d: %.300s", r->route.sandbox_id, *ret_exit, err);
        char *copy = strdup(out ? out : "");
        if (!copy)
                return -ENOMEM;
        size_t len = strlen(copy);
        if (*ret_exit != 0) /* the detail: its first line */
                copy[strcspn(copy, "\n")] = '\0';
        else
                while (len > 0 && (copy[len - 1] == '\n' || copy[len - 1] == ' '))
                        copy[--len] = '\0';
        *ret_out = copy;
        return 0;
}

/* Runs the script's verb with args in the route's sandbox: 0 and its
 * standard output (trailing white space cut) in *ret_out, or e filled. */
static int run_verb(Req *r, const char *verb, const char *const *args, size_t n, int64_t timeout_ms, size_t max_out,
                    char **ret_out, ApiError *e) {
        _cleanup_json_ json_t *argv = json_pack("[s,s,s,s,s]", "bash", "-c", computer_script, "runtime-computer", verb);
        for (size_t i = 0; argv && i < n; i++)
                if (json_array_append_new(argv, json_string(args[i])) < 0)
                        json_decref(TAKE_PTR(argv));
        if (!argv)
                return -ENOMEM;
        _cleanup_free_ char *out = NULL;
        int code = 0;
        int rc = api_sandbox_script(r, argv, timeout_ms, max_out, &out, &code, e);
        if (rc < 0)
                return rc;
        if (code != 0)
                return verb_error(r, code, out, "", e);
        *ret_out = TAKE_PTR(out);
        return 0;
}

static enum MHD_Result reply_failed(Req *r, int rc, const ApiError *e) {
        if (rc == -EPIPE)
                return MHD_NO;
        return e->code ? reply_error(r, e) : reply_internal(r);
}

/* An integer member in [min, max], def when absent or null. */
static int int_field(json_t *o, const char *name, int64_t min, int64_t max, int64_t def, int64_t *ret, ApiError *e) {
        json_t *v = json_object_get(o, name);
        if (!v || json_is_null(v)) {
                *ret = def;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
                return api_error(e, 400, "invalid_request", NULL, "%s must be a whole number from %" PRId64 " to %" PRId64,
                                 name, min, max);
        *ret = json_integer_value(v);
        return 0;
}

/* A string member of 1..max bytes without NUL; NULL when absent and not
 * required. */
static int string_field(json_t *o, const char *name, size_t max, bool required, const char **ret, ApiError *e) {
        json_t *v = json_object_get(o, name);
        if (!v || json_is_null(v)) {
                if (required)
                        return api_error(e, 400, "invalid_request", NULL, "%s is missing", name);
                *ret = NULL;
                return 0;
        }
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > max ||
            strlen(json_string_value(v)) != json_string_length(v))
                return api_error(e, 400, "invalid_request", NULL, "%s must be a string of 1 to %zu bytes", name, max);
        *ret = json_string_value(v);
        return 0;
}

static int fields_known(json_t *o, const char *const *known, ApiError *e) {
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v) {
                size_t i = 0;
                while (known[i] && strcmp(known[i], k) != 0)
                        i++;
                if (!known[i])
                        return api_error(e, 400, "invalid_request", NULL, "unknown field %.64s", k);
        }
        return 0;
}

/* {width, height} of a start. */
static int screen_size(json_t *body, char w[12], char h[12], ApiError *e) {
        int64_t wv, hv;
        int rc = int_field(body, "width", SCREEN_MIN_SIDE, SCREEN_MAX_W, SCREEN_DEFAULT_W, &wv, e);
        if (rc < 0 || (rc = int_field(body, "height", SCREEN_MIN_SIDE, SCREEN_MAX_H, SCREEN_DEFAULT_H, &hv, e)) < 0)
                return rc;
        snprintf(w, 12, "%" PRId64, wv);
        snprintf(h, 12, "%" PRId64, hv);
        return 0;
}

/* A URL of the preview listener for the sandbox's port, with the token in
 * its query: scheme "ws" turns http(s) into ws(s). */
static int shared_url(Req *r, unsigned port, bool ws, const char *path, const char *query, char *buf, size_t n,
                      ApiError *e) {
        char base[400], token[PREVIEW_TOKEN_MAX];
        int rc = api_preview_share(r, port, base, sizeof base, token, e);
        if (rc < 0)
                return rc;
        const char *rest = strncmp(base, "https", 5) == 0 ? base + 5 : base + 4;
        const char *scheme = ws ? (base[4] == 's' ? "wss" : "ws") : (base[4] == 's' ? "https" : "http");
        int len = snprintf(buf, n, "%s%s%s?%s%s=%s", scheme, rest, path, query, PREVIEW_TOKEN_ARG, token);
        explicit_bzero(token, sizeof token);
        if (len < 0 || (size_t)len >= n)
                return api_error(e, 500, "internal", NULL, "the URL is too long");
        return 0;
}

/* The live view (noVNC), or null when the image has none. */
static json_t *stream_url(Req *r, bool has_view, ApiError *e) {
        char url[800];
        if (!has_view)
                return json_null();
        if (shared_url(r, COMPUTER_VIEW_PORT, false, "/vnc.html", "autoconnect=1&resize=scale&", url, sizeof url, e) < 0)
                return NULL;
        return json_string(url);
}

/* The browser as the API shows it, from the script's "PATH HEADLESS". */
static json_t *browser_json(Req *r, const char *out, ApiError *e) {
        char path[128] = "";
        int headless = 1;
        if (sscanf(out, "%127s %d", path, &headless) != 2 || strncmp(path, "/devtools/browser/", 18) != 0) {
                log_error(r->rid, "the browser of %s answered %.200s", r->route.sandbox_id, out);
                api_error(e, 500, "internal", NULL, "the browser's DevTools gave no address");
                return NULL;
        }
        char cdp[800];
        if (shared_url(r, COMPUTER_CDP_PORT, true, path, "", cdp, sizeof cdp, e) < 0)
                return NULL;
        json_t *stream = headless ? json_null() : stream_url(r, true, e);
        if (!stream)
                return NULL;
        return json_pack("{s:b,s:b,s:s,s:o}", "running", 1, "headless", headless, "cdpUrl", cdp, "streamUrl", stream);
}

static int previews_offered(Req *r, ApiError *e) {
        if (!r->app->previews)
                return api_error(e, 501, "previews_unavailable", "start runtimed with --preview-listen ADDR:PORT",
                                 "the browser's DevTools and the desktop's live view are served on the preview "
                                 "listener, and this server has none");
        return 0;
}

enum MHD_Result handle_browser_start(Req *r) {
        static const char *const known[] = { "headless", "width", "height", NULL };
        ApiError e = { 0 };
        char w[12], h[12];
        json_t *jh = json_object_get(r->json, "headless");
        int rc = fields_known(r->json, known, &e);
        if (rc == 0 && jh && !json_is_null(jh) && !json_is_boolean(jh))
                rc = api_error(&e, 400, "invalid_request", NULL, "headless must be true or false");
        if (rc == 0)
                rc = screen_size(r->json, w, h, &e);
        if (rc == 0)
                rc = previews_offered(r, &e);
        if (rc == 0)
                rc = driver_supported(r, "browser", &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        const char *args[] = { jh && json_is_false(jh) ? "0" : "1", w, h };
        _cleanup_free_ char *out = NULL;
        rc = run_verb(r, "browser-start", args, ELEMENTSOF(args), START_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        json_t *j = browser_json(r, out, &e);
        if (!j)
                return reply_failed(r, -EIO, &e);
        json_object_set_new(j, "width", json_integer(atoi(w)));
        json_object_set_new(j, "height", json_integer(atoi(h)));
        return reply_json(r, 200, j);
}

enum MHD_Result handle_browser_get(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *out = NULL;
        int rc = previews_offered(r, &e);
        if (rc == 0)
                rc = run_verb(r, "browser-get", NULL, 0, ACT_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, &e);
        if (rc == -ESRCH)
                /* Not running (never started, stopped, or it crashed). */
                return reply_json(r, 200, json_pack("{s:b,s:n,s:n}", "running", 0, "cdpUrl", "streamUrl"));
        if (rc < 0)
                return reply_failed(r, rc, &e);
        json_t *j = browser_json(r, out, &e);
        return j ? reply_json(r, 200, j) : reply_failed(r, -EIO, &e);
}

/* A stop (an empty body): whether there was something to stop, as the
 * script's "1" or "0". */
static int stop_verb(Req *r, const char *verb, bool *ret_stopped, ApiError *e) {
        static const char *const known[] = { NULL };
        _cleanup_free_ char *out = NULL;
        int rc = fields_known(r->json, known, e);
        if (rc == 0)
                rc = run_verb(r, verb, NULL, 0, ACT_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, e);
        if (rc == 0)
                *ret_stopped = strcmp(out, "1") == 0;
        return rc;
}

enum MHD_Result handle_browser_stop(Req *r) {
        ApiError e = { 0 };
        bool stopped = false;
        int rc = stop_verb(r, "browser-stop", &stopped, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        return reply_json(r, 200, json_pack("{s:b}", "stopped", stopped));
}

enum MHD_Result handle_desktop_start(Req *r) {
        static const char *const known[] = { "width", "height", NULL };
        ApiError e = { 0 };
        char w[12], h[12];
        int rc = fields_known(r->json, known, &e);
        if (rc == 0)
                rc = screen_size(r->json, w, h, &e);
        if (rc == 0)
                rc = driver_supported(r, "desktop", &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        const char *args[] = { w, h };
        _cleanup_free_ char *out = NULL;
        rc = run_verb(r, "desktop-start", args, ELEMENTSOF(args), START_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        int sw = 0, sh = 0;
        char view[16] = "";
        if (sscanf(out, "%d %d %15s", &sw, &sh, view) != 3) {
                log_error(r->rid, "the desktop of %s answered %.200s", r->route.sandbox_id, out);
                return reply_internal(r);
        }
        /* The live view needs the preview listener; without one the
         * desktop runs all the same. */
        json_t *stream = r->app->previews ? stream_url(r, strcmp(view, "view") == 0, &e) : json_null();
        if (!stream)
                return reply_failed(r, -EIO, &e);
        return reply_json(r, 200, json_pack("{s:b,s:i,s:i,s:s,s:o}", "running", 1, "width", sw, "height", sh,
                                            "display", ":99", "streamUrl", stream));
}

enum MHD_Result handle_desktop_stop(Req *r) {
        ApiError e = { 0 };
        bool stopped = false;
        int rc = stop_verb(r, "desktop-stop", &stopped, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        return reply_json(r, 200, json_pack("{s:b,s:b}", "stopped", stopped, "running", 0));
}

typedef struct ShotArgs {
        const char *format, *quality;
        bool other;
} ShotArgs;

static enum MHD_Result shot_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
        (void)kind;
        ShotArgs *a = cls;
        if (strcmp(key, "format") == 0)
                a->format = value ? value : "";
        else if (strcmp(key, "quality") == 0)
                a->quality = value ? value : "";
        else
                a->other = true;
        return MHD_YES;
}

enum MHD_Result handle_desktop_screenshot(Req *r) {
        ApiError e = { 0 };
        ShotArgs a = { 0 };
        MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, shot_arg, &a);
        bool png = !a.format || strcmp(a.format, "png") == 0;
        bool jpeg = a.format && (strcmp(a.format, "jpeg") == 0 || strcmp(a.format, "jpg") == 0);
        long quality = 80;
        char *end = NULL;
        if (a.quality)
                quality = strtol(a.quality, &end, 10);
        if (a.other)
                api_error(&e, 400, "invalid_request", NULL, "the arguments are format and quality");
        else if (!png && !jpeg)
                api_error(&e, 400, "invalid_request", NULL, "format is \"png\" or \"jpeg\"");
        else if (a.quality && (!*a.quality || *end || quality < 1 || quality > 100))
                api_error(&e, 400, "invalid_request", NULL, "quality is a whole number from 1 to 100");
        if (e.code)
                return reply_error(r, &e);
        /* ffmpeg's JPEG scale runs from 2 (best) to 31. */
        char q[24];
        snprintf(q, sizeof q, "%ld", 31 - (quality - 1) * 29 / 99);
        const char *args[] = { png ? "png" : "jpeg", q };
        _cleanup_free_ char *out = NULL;
        int rc = run_verb(r, "screenshot", args, ELEMENTSOF(args), ACT_TIMEOUT_MS, SHOT_MAX_B64, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        uint8_t *data = NULL;
        size_t len = 0;
        if (base64_decode(out, strlen(out), SHOT_MAX_B64, &data, &len) < 0 || len == 0) {
                free(data);
                log_error(r->rid, "the screenshot of %s did not decode", r->route.sandbox_id);
                api_error(&e, 500, "internal", NULL, "the screenshot could not be taken");
                return reply_error(r, &e);
        }
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
        if (!resp) {
                free(data);
                return reply_internal(r);
        }
        return reply_response(r, 200, resp, png ? "image/png" : "image/jpeg");
}

/* ---- :act ---- */

/* A coordinate pair from x and y; false in *ret_given when both are absent. */
static int point(json_t *body, bool required, char x[12], char y[12], bool *ret_given, ApiError *e) {
        json_t *jx = json_object_get(body, "x"), *jy = json_object_get(body, "y");
        bool has_x = jx && !json_is_null(jx), has_y = jy && !json_is_null(jy);
        if (!has_x && !has_y && !required) {
                *ret_given = false;
                return 0;
        }
        if (has_x != has_y || !has_x)
                return api_error(e, 400, "invalid_request", NULL, "x and y are given together");
        int64_t vx, vy;
        int rc = int_field(body, "x", 0, CLICK_MAX_COORD, 0, &vx, e);
        if (rc < 0 || (rc = int_field(body, "y", 0, CLICK_MAX_COORD, 0, &vy, e)) < 0)
                return rc;
        snprintf(x, 12, "%" PRId64, vx);
        snprintf(y, 12, "%" PRId64, vy);
        *ret_given = true;
        return 0;
}

/* A [x, y] pair (drag's from and to). */
static int pair(json_t *body, const char *name, char x[12], char y[12], ApiError *e) {
        json_t *v = json_object_get(body, name);
        json_t *a = json_array_get(v, 0), *b = json_array_get(v, 1);
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(a) || !json_is_integer(b) ||
            json_integer_value(a) < 0 || json_integer_value(a) > CLICK_MAX_COORD || json_integer_value(b) < 0 ||
            json_integer_value(b) > CLICK_MAX_COORD)
                return api_error(e, 400, "invalid_request", NULL, "%s must be [x, y], each from 0 to %d", name,
                                 CLICK_MAX_COORD);
        snprintf(x, 12, "%" JSON_INTEGER_FORMAT, json_integer_value(a));
        snprintf(y, 12, "%" JSON_INTEGER_FORMAT, json_integer_value(b));
        return 0;
}

static int button(json_t *body, const char **ret, ApiError *e) {
        const char *b = NULL;
        int rc = string_field(body, "button", 16, false, &b, e);
        if (rc < 0)
                return rc;
        if (!b || strcmp(b, "left") == 0)
                *ret = "1";
        else if (strcmp(b, "middle") == 0)
                *ret = "2";
        else if (strcmp(b, "right") == 0)
                *ret = "3";
        else
                return api_error(e, 400, "invalid_request", NULL, "button is \"left\", \"middle\" or \"right\"");
        return 0;
}

/* A window id as wmctrl and xdotool print them: 0x and up to 8 hex
 * digits, or decimal. The script reads it in shell arithmetic, so nothing
 * else may pass. */
static bool window_id_ok(const char *s) {
        size_t n = strlen(s);
        if (n > 2 && n <= 10 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
                return strspn(s + 2, "0123456789abcdefABCDEF") == n - 2;
        return n >= 1 && n <= 10 && strspn(s, "0123456789") == n;
}

/* wmctrl -lpG's lines (id desktop pid x y w h host title) after the
 * script's "active ID" line, as window objects. */
static json_t *windows_json(const char *out) {
        _cleanup_json_ json_t *list = json_array();
        unsigned long active = 0;
        const char *line = out;
        if (!list)
                return NULL;
        while (line && *line) {
                const char *nl = strchr(line, '\n');
                size_t len = nl ? (size_t)(nl - line) : strlen(line);
                char buf[1024];
                snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), line);
                unsigned long id = 0;
                int desk, pid, x, y, w, h, title_at = 0;
                char host[256];
                if (sscanf(buf, "active %lu", &id) == 1)
                        active = id;
                else if (sscanf(buf, "%lx %d %d %d %d %d %d %255s %n", &id, &desk, &pid, &x, &y, &w, &h, host,
                                &title_at) == 8) {
                        char hex[16];
                        snprintf(hex, sizeof hex, "0x%08lx", id);
                        const char *title = title_at > 0 ? buf + title_at : "";
                        json_t *win = json_pack("{s:s,s:s%,s:i,s:i,s:i,s:i,s:i,s:b}", "id", hex, "title", title,
                                                strlen(title), "pid", pid, "x", x, "y", y, "width", w, "height", h,
                                                "focused", id == active && active != 0);
                        /* A title that is not UTF-8 is shown empty. */
                        if (!win)
                                win = json_pack("{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:b}", "id", hex, "title", "", "pid", pid,
                                                "x", x, "y", y, "width", w, "height", h, "focused",
                                                id == active && active != 0);
                        if (!win || json_array_append_new(list, win) < 0)
                                return NULL;
                }
                line = nl ? nl + 1 : NULL;
        }
        /* xdotool names the active window in decimal; mark it again now
         * that every id is known. */
        return json_pack("{s:O}", "windows", list);
}

enum MHD_Result handle_desktop_act(Req *r) {
        static const char *const known[] = { "action", "x",    "y",        "button", "double", "from", "to", "dx",
                                             "dy",     "text", "delayMs", "keys",   "windowId", "url", "argv", NULL };
        ApiError e = { 0 };
        const char *action = NULL;
        const char *args[VERB_MAX_ARGS] = { NULL };
        size_t n = 0;
        char x[12] = "-", y[12] = "-", x2[12], y2[12], num[3][12];
        const char *verb = NULL, *b = "1", *s = NULL;
        int64_t timeout_ms = ACT_TIMEOUT_MS, v1 = 0, v2 = 0;
        bool given = false;
        int rc = fields_known(r->json, known, &e);
        if (rc == 0)
                rc = string_field(r->json, "action", 32, true, &action, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        if (strcmp(action, "move") == 0) {
                verb = "move";
                rc = point(r->json, true, x, y, &given, &e);
                args[n++] = x, args[n++] = y;
        } else if (strcmp(action, "click") == 0) {
                verb = "click";
                json_t *d = json_object_get(r->json, "double");
                if (d && !json_is_null(d) && !json_is_boolean(d))
                        rc = api_error(&e, 400, "invalid_request", NULL, "double must be true or false");
                if (rc == 0)
                        rc = point(r->json, false, x, y, &given, &e);
                if (rc == 0)
                        rc = button(r->json, &b, &e);
                args[n++] = x, args[n++] = y, args[n++] = b, args[n++] = json_is_true(d) ? "2" : "1";
        } else if (strcmp(action, "mouseDown") == 0 || strcmp(action, "mouseUp") == 0) {
                verb = action[5] == 'D' ? "mousedown" : "mouseup";
                rc = button(r->json, &b, &e);
                args[n++] = b;
        } else if (strcmp(action, "drag") == 0) {
                verb = "drag";
                rc = pair(r->json, "from", x, y, &e);
                if (rc == 0)
                        rc = pair(r->json, "to", x2, y2, &e);
                args[n++] = x, args[n++] = y, args[n++] = x2, args[n++] = y2;
        } else if (strcmp(action, "scroll") == 0) {
                verb = "scroll";
                rc = int_field(r->json, "dy", -SCROLL_MAX_CLICKS, SCROLL_MAX_CLICKS, 0, &v1, &e);
                if (rc == 0)
                        rc = int_field(r->json, "dx", -SCROLL_MAX_CLICKS, SCROLL_MAX_CLICKS, 0, &v2, &e);
                if (rc == 0)
                        rc = point(r->json, false, x, y, &given, &e);
                snprintf(num[0], 12, "%" PRId64, v1);
                snprintf(num[1], 12, "%" PRId64, v2);
                args[n++] = num[0], args[n++] = num[1], args[n++] = x, args[n++] = y;
        } else if (strcmp(action, "type") == 0) {
                verb = "type";
                rc = string_field(r->json, "text", TYPE_MAX_BYTES, true, &s, &e);
                if (rc == 0)
                        rc = int_field(r->json, "delayMs", 0, TYPE_MAX_DELAY_MS, 12, &v1, &e);
                if (rc == 0 && (int64_t)strlen(s) * v1 > TYPE_MAX_MS)
                        rc = api_error(&e, 400, "invalid_request", "type less at a time, or with a shorter delay",
                                       "typing this would take more than %d seconds", TYPE_MAX_MS / 1000);
                if (rc == 0)
                        timeout_ms += (int64_t)strlen(s) * (v1 + 5);
                snprintf(num[0], 12, "%" PRId64, v1);
                args[n++] = s, args[n++] = num[0];
        } else if (strcmp(action, "key") == 0) {
                verb = "key";
                rc = string_field(r->json, "keys", KEYS_MAX_BYTES, true, &s, &e);
                /* Names, '+' between the keys of a chord and spaces between
                 * chords: X key names are letters, digits and '_'. */
                if (rc == 0 && (strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+ ") !=
                                        strlen(s) ||
                                strspn(s, " ") == strlen(s)))
                        rc = api_error(&e, 400, "invalid_request", "X key names, as xdotool takes them: Return, ctrl+l, alt+Tab, F5",
                                       "keys holds a character that is no part of a key name");
                args[n++] = s;
        } else if (strcmp(action, "cursor") == 0) {
                verb = "cursor";
        } else if (strcmp(action, "windows") == 0) {
                verb = "windows";
        } else if (strcmp(action, "focus") == 0) {
                verb = "focus";
                rc = string_field(r->json, "windowId", 16, true, &s, &e);
                if (rc == 0 && !window_id_ok(s))
                        rc = api_error(&e, 400, "invalid_request", "an id that windows answered", "windowId is no window id");
                args[n++] = s;
        } else if (strcmp(action, "open") == 0) {
                verb = "open";
                rc = string_field(r->json, "url", URL_MAX_BYTES, true, &s, &e);
                if (rc == 0 && strncmp(s, "http://", 7) != 0 && strncmp(s, "https://", 8) != 0 &&
                    strncmp(s, "file:///", 8) != 0 && s[0] != '/')
                        rc = api_error(&e, 400, "invalid_request", NULL,
                                       "url is an http(s) or file URL, or an absolute path in the sandbox");
                if (rc == 0 && strpbrk(s, "\r\n\t "))
                        rc = api_error(&e, 400, "invalid_request", NULL, "url holds white space");
                timeout_ms = START_TIMEOUT_MS;
                args[n++] = s;
        } else if (strcmp(action, "launch") == 0) {
                verb = "launch";
                json_t *argv = json_object_get(r->json, "argv"), *item;
                size_t i;
                if (!json_is_array(argv) || json_array_size(argv) == 0 || json_array_size(argv) > LAUNCH_MAX_ARGS)
                        rc = api_error(&e, 400, "invalid_request", NULL, "argv must be 1 to %d strings", LAUNCH_MAX_ARGS);
                json_array_foreach(argv, i, item) {
                        if (rc < 0)
                                break;
                        if (!json_is_string(item) || json_string_length(item) > LAUNCH_MAX_ARG_BYTES ||
                            strlen(json_string_value(item)) != json_string_length(item) ||
                            (i == 0 && json_string_length(item) == 0))
                                rc = api_error(&e, 400, "invalid_request", NULL,
                                               "argv[%zu] must be a string of up to %d bytes without NUL", i,
                                               LAUNCH_MAX_ARG_BYTES);
                        else
                                args[n++] = json_string_value(item);
                }
        } else {
                rc = api_error(&e, 400, "invalid_request",
                               "move, click, mouseDown, mouseUp, drag, scroll, type, key, cursor, windows, focus, open, launch",
                               "unknown action \"%.32s\"", action);
        }
        if (rc < 0)
                return reply_failed(r, rc, &e);
        /* The trail names the action, and what a launch or an open starts;
         * never the text typed, which may be a password. */
        req_audit_note(r, "action", action);
        if (strcmp(verb, "launch") == 0 || strcmp(verb, "open") == 0)
                req_audit_note(r, "target", args[0]);
        _cleanup_free_ char *out = NULL;
        rc = run_verb(r, verb, args, n, timeout_ms, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        if (strcmp(verb, "cursor") == 0) {
                int cx = 0, cy = 0;
                if (sscanf(out, "%d %d", &cx, &cy) != 2)
                        return reply_internal(r);
                return reply_json(r, 200, json_pack("{s:i,s:i}", "x", cx, "y", cy));
        }
        if (strcmp(verb, "windows") == 0) {
                json_t *j = windows_json(out);
                return j ? reply_json(r, 200, j) : reply_internal(r);
        }
        if (strcmp(verb, "launch") == 0)
                return reply_json(r, 200, json_pack("{s:b,s:i}", "ok", 1, "pid", atoi(out)));
        return reply_json(r, 200, json_pack("{s:b}", "ok", 1));
}

/* ---- recordings ---- */

/* Bounds of a recording: frames a second, its length, its file. */
#define REC_MAX_FPS 30
#define REC_DEFAULT_FPS 10
#define REC_MAX_SECONDS 3600
#define REC_DEFAULT_SECONDS 300
#define REC_MAX_MIB 1024
#define REC_DEFAULT_MIB 100
#define REC_DEFAULT_CRF 28
/* A stop waits for ffmpeg to write the file's index (15 s in the script). */
#define REC_STOP_TIMEOUT_MS 30000

/* One line of the script's "ID STATE FPS MAX_SECONDS MAX_MIB STARTED SIZE"
 * as the API's recording; NULL when it is not one. */
static json_t *recording_json(const char *line) {
        char id[32], state[16], at[RFC3339_LEN];
        int fps, seconds, mib;
        long long started, size;
        if (sscanf(line, "%31s %15s %d %d %d %lld %lld", id, state, &fps, &seconds, &mib, &started, &size) != 7 ||
            time_format_rfc3339(started, at) < 0)
                return NULL;
        return json_pack("{s:s,s:s,s:i,s:i,s:i,s:s,s:I}", "id", id, "state", state, "fps", fps, "maxSeconds", seconds,
                         "maxMiB", mib, "startedAt", at, "sizeBytes", (json_int_t)size);
}

static enum MHD_Result reply_recording(Req *r, unsigned status, const char *out) {
        json_t *j = recording_json(out);
        if (!j) {
                log_error(r->rid, "a recording of %s answered %.200s", r->route.sandbox_id, out);
                return reply_internal(r);
        }
        return reply_json(r, status, j);
}

enum MHD_Result handle_recording_start(Req *r) {
        static const char *const known[] = { "fps", "maxSeconds", "maxMiB", "crf", NULL };
        ApiError e = { 0 };
        int64_t fps, seconds, mib, crf;
        int rc = fields_known(r->json, known, &e);
        if (rc == 0)
                rc = int_field(r->json, "fps", 1, REC_MAX_FPS, REC_DEFAULT_FPS, &fps, &e);
        if (rc == 0)
                rc = int_field(r->json, "maxSeconds", 1, REC_MAX_SECONDS, REC_DEFAULT_SECONDS, &seconds, &e);
        if (rc == 0)
                rc = int_field(r->json, "maxMiB", 1, REC_MAX_MIB, REC_DEFAULT_MIB, &mib, &e);
        if (rc == 0)
                rc = int_field(r->json, "crf", 0, 51, REC_DEFAULT_CRF, &crf, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        char id[32] = "rec_", num[4][24];
        if (random_hex(id + 4, 10) < 0)
                return reply_internal(r);
        snprintf(num[0], sizeof num[0], "%" PRId64, fps);
        snprintf(num[1], sizeof num[1], "%" PRId64, seconds);
        snprintf(num[2], sizeof num[2], "%" PRId64, mib);
        snprintf(num[3], sizeof num[3], "%" PRId64, crf);
        const char *args[] = { id, num[0], num[1], num[2], num[3] };
        _cleanup_free_ char *out = NULL;
        rc = run_verb(r, "rec-start", args, ELEMENTSOF(args), ACT_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        return reply_recording(r, 201, out);
}

/* A verb on the route's recording, answered as the recording. */
static enum MHD_Result recording_verb(Req *r, const char *verb, int64_t timeout_ms) {
        ApiError e = { 0 };
        const char *args[] = { r->route.recording };
        _cleanup_free_ char *out = NULL;
        int rc = run_verb(r, verb, args, ELEMENTSOF(args), timeout_ms, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        if (strcmp(verb, "rec-delete") == 0)
                return reply_json(r, 200, json_pack("{s:s,s:b}", "id", r->route.recording, "deleted", 1));
        return reply_recording(r, 200, out);
}

enum MHD_Result handle_recording_stop(Req *r) {
        return recording_verb(r, "rec-stop", REC_STOP_TIMEOUT_MS);
}

enum MHD_Result handle_recording_get(Req *r) {
        return recording_verb(r, "rec-get", ACT_TIMEOUT_MS);
}

enum MHD_Result handle_recording_delete(Req *r) {
        return recording_verb(r, "rec-delete", ACT_TIMEOUT_MS);
}

enum MHD_Result handle_recordings_list(Req *r) {
        ApiError e = { 0 };
        _cleanup_free_ char *out = NULL;
        int rc = run_verb(r, "rec-list", NULL, 0, ACT_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        _cleanup_json_ json_t *data = json_array();
        if (!data)
                return reply_internal(r);
        for (char *save = NULL, *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                json_t *j = recording_json(line);
                if (j && json_array_append_new(data, j) < 0)
                        return reply_internal(r);
        }
        return reply_json(r, 200, json_pack("{s:O}", "data", data));
}

enum MHD_Result handle_recording_video(Req *r) {
        /* Its state first: a recording still running is not a whole file,
         * and no such recording is a 404 rather than a missing file. */
        ApiError e = { 0 };
        const char *args[] = { r->route.recording };
        _cleanup_free_ char *out = NULL;
        int rc = run_verb(r, "rec-get", args, ELEMENTSOF(args), ACT_TIMEOUT_MS, VERB_OUTPUT_MAX, &out, &e);
        if (rc < 0)
                return reply_failed(r, rc, &e);
        _cleanup_json_ json_t *j = recording_json(out);
        if (!j)
                return reply_internal(r);
        if (strcmp(json_string_value(json_object_get(j, "state")), "done") != 0) {
                api_error(&e, 409, "conflict", "stop it first: POST .../desktop/recordings/{id}:stop",
                          "recording %s is still running", r->route.recording);
                return reply_error(r, &e);
        }
        char path[96];
        snprintf(path, sizeof path, "/tmp/.runtime-desktop/rec/%s.mp4", r->route.recording);
        return api_files_send(r, path, "video/mp4");
}
