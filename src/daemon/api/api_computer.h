#pragma once
/* The browser and the desktop of a sandbox (docs/computer-use.md):
 * POST .../browser:start, GET .../browser, POST .../browser:stop;
 * POST .../desktop:start, .../desktop:stop, .../desktop:act and
 * GET .../desktop/screenshot; the desktop's recordings under
 * .../desktop/recordings. */
#include "daemon/http/http.h"

enum MHD_Result handle_browser_start(Req *r);
enum MHD_Result handle_browser_get(Req *r);
enum MHD_Result handle_browser_stop(Req *r);
enum MHD_Result handle_desktop_start(Req *r);
enum MHD_Result handle_desktop_stop(Req *r);
enum MHD_Result handle_desktop_screenshot(Req *r);
enum MHD_Result handle_desktop_act(Req *r);
enum MHD_Result handle_recording_start(Req *r);
enum MHD_Result handle_recordings_list(Req *r);
enum MHD_Result handle_recording_get(Req *r);
enum MHD_Result handle_recording_stop(Req *r);
enum MHD_Result handle_recording_delete(Req *r);
enum MHD_Result handle_recording_video(Req *r);
