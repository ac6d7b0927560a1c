/* Runtime dashboard (docs/dashboard.md): a hash-routed page over the daemon's
 * HTTP API (docs/api.md), signed in with an API key kept in sessionStorage.
 *
 * Everything the API answers is hostile text: every node is made with
 * createElement/createElementNS and filled with textContent; no server value
 * is ever parsed as markup, put in an attribute a script could read as a URL
 * or handler, or used as a link (links are our own #/ routes, built only from
 * ids that match ID_RE). Never add a markup-from-string API to this file. */
'use strict';

(() => {
  const KEY_STORE = 'runtime.dashboard.key';
  const ID_RE = /^[A-Za-z0-9_.-]{1,128}$/;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const STATES = ['running', 'paused', 'stopped', 'failed', 'lost'];
  const DASH = '\u2014';
  const NAV = [['sandboxes', 'Sandboxes'], ['spending', 'Spending'], ['keys', 'Keys'], ['images', 'Images'],
    ['snapshots', 'Snapshots'], ['webhooks', 'Webhooks'], ['events', 'Events']];

  let me = null;          // GET /v1/me of the signed-in key
  let page = null;        // the page shown: {timers, refreshers}; replaced on every route
  let shell = null;       // header and main of the signed-in layout
  let signInNote = null;  // why the last session ended, shown on the sign-in form
  const root = document.getElementById('app');

  // ---------------------------------------------------------------- DOM helpers

  // Attributes a server value could turn into script or a request: never set through el()/svg().
  const UNSAFE_ATTR = /^(on|style$|href$|src$|srcdoc$|action$|formaction$|xlink|srcset$|background$|poster$)/i;

  function setAttrs(node, opts) {
    for (const [k, v] of Object.entries(opts || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') node.textContent = String(v);
      else if (k === 'class') node.setAttribute('class', v);
      else if (k === 'testid') node.setAttribute('data-testid', v);
      else if (k === 'data') for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
      else if (k === 'on') for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
      else if (k === 'value' || k === 'checked' || k === 'selected' || k === 'disabled') node[k] = v;
      else if (UNSAFE_ATTR.test(k)) throw new Error('unsafe attribute ' + k);
      else node.setAttribute(k, v === true ? '' : String(v));
    }
  }

  function append(node, ...kids) {
    for (const k of kids.flat(Infinity)) {
      if (k === null || k === undefined || k === false) continue;
      node.appendChild(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return node;
  }

  // el('div', {class: 'x', text: 'y'}, child, 'text', [more]): an element, its text set as text.
  function el(tag, opts, ...kids) {
    const node = document.createElement(tag);
    setAttrs(node, opts);
    return append(node, ...kids);
  }

  function svg(tag, opts, ...kids) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, opts);
    return append(node, ...kids);
  }

  function fill(container, ...kids) {
    container.replaceChildren();
    return append(container, ...kids);
  }

  // A link to one of our own pages; any id not of the safe shape stays plain text.
  function routeLink(kind, id, text) {
    const label = text === undefined || text === null || text === '' ? id : text;
    if (typeof id !== 'string' || !ID_RE.test(id)) return el('span', {text: label});
    const a = el('a', {text: label});
    a.href = '#/' + kind + '/' + encodeURIComponent(id);
    return a;
  }

  function staticLink(route, text) {
    const a = el('a', {text});
    a.href = '#/' + route;
    return a;
  }

  function labeled(text, control) {
    return el('label', {class: 'field'}, el('span', {text}), control);
  }

  function section(title, testid) {
    const body = el('div', {class: 'section-body'}, loading());
    return {el: el('section', {class: 'card', testid}, el('h2', {text: title}), body), body};
  }

  function loading() {
    return el('p', {class: 'muted', text: 'Loading\u2026'});
  }

  // ---------------------------------------------------------------- formatting

  function pad(n, w = 2) {
    return String(n).padStart(w, '0');
  }

  // RFC 3339 strings and unix seconds (processes, some event data) alike.
  function toDate(v) {
    if (v === null || v === undefined || v === '') return null;
    const d = typeof v === 'number' ? new Date(v * 1000) : new Date(String(v));
    return Number.isNaN(d.getTime()) ? null : d;
  }

  function fmtTime(v) {
    const d = toDate(v);
    if (!d) return v === null || v === undefined || v === '' ? DASH : String(v);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function fmtSpan(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor(s % 3600 / 60))}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor(s % 86400 / 3600)}h`;
  }

  function ago(v) {
    const d = toDate(v);
    if (!d) return '';
    const diff = (Date.now() - d.getTime()) / 1000;
    return diff >= 0 ? fmtSpan(diff) + ' ago' : 'in ' + fmtSpan(-diff);
  }

  // A time with its relative age beside it.
  function timeCell(v) {
    const d = toDate(v);
    if (!d) return fmtTime(v);
    return el('span', {class: 'time'}, fmtTime(v), ' ', el('span', {class: 'age', text: ago(v)}));
  }

  function dollars(micros) {
    if (micros === null || micros === undefined || micros === '') return DASH;
    const n = Number(micros);
    return Number.isFinite(n) ? '$' + (n / 1e6).toFixed(4) : String(micros);
  }

  function bytes(n) {
    if (n === null || n === undefined || !Number.isFinite(Number(n))) return DASH;
    let v = Number(n);
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(1)) + ' ' + units[i];
  }

  function labelsText(labels) {
    if (!labels || typeof labels !== 'object') return '';
    return Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(', ');
  }

  function yesNo(b) {
    return b === true ? 'yes' : b === false ? 'no' : DASH;
  }

  // Any JSON value as one line of text.
  function asText(v) {
    if (v === null || v === undefined) return DASH;
    if (typeof v === 'string') return v;
    try { return JSON.stringify(v); } catch (_) { return String(v); }
  }

  const STATE_CLASS = {running: 'ok', ready: 'ok', delivered: 'ok', exited: 'neutral', live: 'ok', full: 'ok',
    paused: 'warn', pending: 'warn', starting: 'warn', pausing: 'warn', resuming: 'warn', stopping: 'warn',
    draining: 'warn', read: 'warn', stopped: 'neutral', deleted: 'neutral', failed: 'bad', lost: 'bad',
    killed: 'bad', timed_out: 'bad', dead: 'bad', allowed: 'ok', refused: 'bad'};

  // A state as a coloured badge: the class comes from our own table, the text is the server's.
  function badge(state) {
    if (state === null || state === undefined) return DASH;
    const s = String(state);
    const cls = Object.prototype.hasOwnProperty.call(STATE_CLASS, s) ? STATE_CLASS[s] : 'other';
    return el('span', {class: 'badge badge-' + cls, text: s});
  }

  // Field names never shown, whatever an answer holds.
  const SECRET_FIELD = /^(key|secret)$|secret|password|token|hash/i;

  // The fields of obj not in `known`, as "name: value" text (never a secret-looking one).
  function otherFields(obj, known) {
    const parts = [];
    for (const [k, v] of Object.entries(obj || {})) {
      if (known.includes(k) || SECRET_FIELD.test(k)) continue;
      parts.push(`${k}: ${asText(v)}`);
    }
    return parts.join('; ');
  }

  // ---------------------------------------------------------------- tables

  function cell(v) {
    if (v === null || v === undefined || v === '') return DASH;
    return v;
  }

  // cols: [{t: title, v: row => value or node, cls}]; opts.row(tr, r) decorates each row.
  function table(cols, rows, opts = {}) {
    if (!rows.length) return el('p', {class: 'muted empty', text: opts.empty || 'Nothing here.'});
    const head = el('tr', null, cols.map(c => el('th', {class: c.cls, text: c.t})));
    const body = rows.map(r => {
      const tr = el('tr', null, cols.map(c => el('td', {class: c.cls}, cell(c.v(r)))));
      if (opts.testid) tr.setAttribute('data-testid', opts.testid);
      if (opts.key) tr.dataset.key = rowKey(opts.key(r));
      if (opts.row) opts.row(tr, r);
      return tr;
    });
    return el('div', {class: 'table-wrap'},
      el('table', {class: 'grid' + (opts.cls ? ' ' + opts.cls : '')}, el('thead', null, head), el('tbody', null, body)));
  }

  function rowKey(k) {
    return typeof k === 'string' && ID_RE.test(k) ? k : '';
  }

  // Shows a table made by table() in container. When it already shows one with the same columns,
  // its rows (matched by data-key) and their unchanged cells stay in place and only what changed is
  // replaced: a refresh then keeps a person's text selection, and the rows stay the same elements.
  function patch(container, fresh) {
    const old = container.childElementCount === 1 ? container.firstElementChild.querySelector('table.grid') : null;
    const neu = fresh.querySelector ? fresh.querySelector('table.grid') : null;
    if (!old || !neu || old.tHead.textContent !== neu.tHead.textContent) {
      fill(container, fresh);
      return;
    }
    const byKey = new Map();
    for (const tr of [...old.tBodies[0].rows]) if (tr.dataset.key) byKey.set(tr.dataset.key, tr);
    const body = old.tBodies[0];
    const wanted = [...neu.tBodies[0].rows].map(ntr => {
      const otr = ntr.dataset.key ? byKey.get(ntr.dataset.key) : null;
      if (!otr || otr.cells.length !== ntr.cells.length) return ntr;
      byKey.delete(ntr.dataset.key);
      [...ntr.cells].forEach((ntd, i) => {
        if (otr.cells[i].textContent !== ntd.textContent) otr.cells[i].replaceWith(ntd);
      });
      otr.className = ntr.className;
      return otr;
    });
    wanted.forEach((tr, i) => {
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    while (body.children.length > wanted.length) body.lastElementChild.remove();
  }

  // A two-column table of name/value pairs.
  function kvTable(pairs) {
    return el('table', {class: 'kv'}, el('tbody', null,
      pairs.map(([k, v]) => el('tr', null, el('th', {text: k}), el('td', null, cell(v))))));
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, body, fallback) {
      const e = body && typeof body.error === 'object' && body.error ? body.error : {};
      super(typeof e.message === 'string' ? e.message : fallback || `The daemon answered ${status}.`);
      this.status = status;
      this.code = typeof e.code === 'string' ? e.code : '';
      this.hint = typeof e.hint === 'string' ? e.hint : '';
      this.requestId = typeof e.requestId === 'string' ? e.requestId : '';
    }
  }

  // path with its query: every value encoded, empty ones left out.
  function url(path, params) {
    const q = [];
    for (const [k, v] of Object.entries(params || {})) {
      if (v === undefined || v === null || v === '') continue;
      q.push(encodeURIComponent(k) + '=' + encodeURIComponent(v));
    }
    return q.length ? path + '?' + q.join('&') : path;
  }

  function sbx(id, rest = '') {
    return '/v1/sandboxes/' + encodeURIComponent(id) + rest;
  }

  // One API call with the key in the Authorization header (never in a URL).
  // A 401 signs the page out, unless it is the sign-in's own check.
  async function api(path, opts = {}) {
    const key = opts.key || sessionStorage.getItem(KEY_STORE) || '';
    const headers = {Authorization: 'Bearer ' + key, Accept: 'application/json'};
    const init = {method: opts.method || 'GET', headers, cache: 'no-store', credentials: 'omit',
      redirect: 'error', referrerPolicy: 'no-referrer'};
    if (opts.body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(opts.body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, null, 'The daemon did not answer (' + (e && e.message ? e.message : 'network error') + ').');
    }
    if (!res.ok) {
      let body = null;
      try { body = await res.json(); } catch (_) { /* not JSON */ }
      const err = new ApiError(res.status, body);
      if (res.status === 401 && !opts.signingIn) signOut('Signed out: ' + err.message);
      throw err;
    }
    if (opts.raw) return res;
    try {
      return await res.json();
    } catch (_) {
      throw new ApiError(res.status, null, 'The daemon answered something that is not JSON.');
    }
  }

  // An error where the section's content would be: message, hint and request id as text.
  function errorBox(err) {
    const msg = err && err.message ? err.message : String(err);
    return el('div', {class: 'error', role: 'alert', testid: 'error'},
      el('p', {class: 'error-message', text: msg}),
      err && err.hint ? el('p', {class: 'hint', text: err.hint}) : null,
      err && err.requestId ? el('p', {class: 'request-id', text: 'request ' + err.requestId}) : null);
  }

  // ---------------------------------------------------------------- pages and timers

  function leavePage() {
    if (page) for (const t of page.timers) clearInterval(t);
    page = null;
  }

  function enterPage() {
    leavePage();
    page = {timers: [], refreshers: []};
    return page;
  }

  function alive(p) {
    return page === p;
  }

  // Runs fn every ms while page p is shown and the tab is visible; never two at once.
  function live(p, ms, fn) {
    let busy = false;
    const tick = async () => {
      if (!alive(p) || document.hidden || busy) return;
      busy = true;
      try { await fn(); } finally { busy = false; }
    };
    p.timers.push(setInterval(tick, ms));
    p.refreshers.push(tick);
  }

  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && page) for (const f of page.refreshers) f();
  });

  // Runs a section's loader: its error replaces the section's content.
  async function guarded(p, container, fn) {
    try {
      await fn();
    } catch (e) {
      if (alive(p)) fill(container, errorBox(e));
    }
  }

  function setTitle(t) {
    document.title = t + ' \u00b7 Runtime';
  }

  // ---------------------------------------------------------------- sign in, sign out

  function signOut(note) {
    sessionStorage.removeItem(KEY_STORE);
    me = null;
    leavePage();
    shell = null;
    signInNote = note || null;
    render();
  }

  function renderSignIn() {
    setTitle('Sign in');
    const box = el('input', {type: 'password', id: 'key', name: 'key', autocomplete: 'off', spellcheck: 'false',
      required: true, testid: 'signin-key', placeholder: 'rt_\u2026'});
    const button = el('button', {type: 'submit', class: 'primary', text: 'Sign in', testid: 'signin-button'});
    const out = el('div', {class: 'signin-out', testid: 'signin-error'});
    if (signInNote) append(out, el('p', {class: 'note', text: signInNote}));
    const form = el('form', {class: 'signin', autocomplete: 'off', testid: 'signin-form'},
      el('label', {for: 'key', text: 'API key'}), box, button, out);
    form.addEventListener('submit', async ev => {
      ev.preventDefault();
      const key = box.value.trim();
      if (!/^[\x21-\x7e]{1,512}$/.test(key)) {
        fill(out, errorBox(new Error('That is not an API key (keys look like rt_ and 40 hex digits).')));
        return;
      }
      button.disabled = true;
      fill(out, el('p', {class: 'muted', text: 'Checking the key\u2026'}));
      try {
        const who = await api('/v1/me', {key, signingIn: true});
        sessionStorage.setItem(KEY_STORE, key);
        box.value = '';
        me = who;
        signInNote = null;
        render();
      } catch (e) {
        box.value = '';
        button.disabled = false;
        fill(out, errorBox(e));
        box.focus();
      }
    });
    fill(root, el('main', {class: 'signin-page'},
      el('h1', {text: 'Runtime dashboard'}),
      el('p', {class: 'muted', text: 'Sign in with an API key. It is kept in this tab only and sent to this daemon alone.'}),
      form));
    box.focus();
  }

  // The header: nav, who is signed in, Sign out.
  function buildShell() {
    const links = NAV.map(([route, text]) => {
      const a = staticLink(route, text);
      a.dataset.route = route;
      return a;
    });
    const who = el('span', {class: 'whoami', testid: 'whoami'},
      el('span', {class: 'owner', text: me.owner || DASH}), ' \u00b7 ',
      el('span', {class: 'keyname', text: me.keyName || me.keyId || DASH}), ' ',
      badge(me.access));
    const out = el('button', {type: 'button', class: 'signout', text: 'Sign out', testid: 'signout'});
    out.addEventListener('click', () => signOut('Signed out.'));
    const main = el('main', {id: 'main'});
    const header = el('header', {class: 'top'},
      el('span', {class: 'brand', text: 'Runtime'}),
      el('nav', null, links),
      el('span', {class: 'spacer'}), who, out);
    fill(root, header, main);
    return {header, main, links};
  }

  // ---------------------------------------------------------------- router

  function routeParts() {
    const h = location.hash.replace(/^#\/?/, '');
    return h.split('/').filter(Boolean).map(s => {
      try { return decodeURIComponent(s); } catch (_) { return s; }
    });
  }

  function render() {
    if (!me) {
      leavePage();
      renderSignIn();
      return;
    }
    if (!shell) shell = buildShell();
    const parts = routeParts();
    if (!parts.length) {
      location.replace('#/sandboxes');
      return;
    }
    for (const a of shell.links) {
      const on = a.dataset.route === parts[0];
      a.classList.toggle('active', on);
      if (on) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    const p = enterPage();
    const main = fill(shell.main);
    const [kind, id, extra] = parts;
    const pages = {sandboxes: id === undefined ? pageSandboxes : pageSandbox, spending: pageSpending, keys: pageKeys,
      images: pageImages, snapshots: pageSnapshots, webhooks: id === undefined ? pageWebhooks : pageWebhook,
      events: pageEvents};
    const fn = Object.prototype.hasOwnProperty.call(pages, kind) && extra === undefined ? pages[kind] : null;
    if (!fn || (id !== undefined && !['sandboxes', 'webhooks'].includes(kind))) {
      setTitle('Not found');
      append(main, el('h1', {text: 'Not found'}), el('p', null, 'No such page. ', staticLink('sandboxes', 'Sandboxes')));
      return;
    }
    fn(p, main, id).catch(e => { if (alive(p)) append(main, errorBox(e)); });
  }

  window.addEventListener('hashchange', render);

  // ---------------------------------------------------------------- Sandboxes

  const listFilter = {state: 'all', text: ''};

  // Every page of GET /v1/sandboxes (at most 10 of 100).
  async function allSandboxes() {
    const out = [];
    let cursor = null;
    for (let i = 0; i < 10; i++) {
      const r = await api(url('/v1/sandboxes', {limit: 100, cursor}));
      out.push(...(Array.isArray(r.data) ? r.data : Array.isArray(r.sandboxes) ? r.sandboxes : []));
      cursor = r.nextCursor;
      if (!cursor) break;
    }
    return out;
  }

  function matchesFilter(s) {
    if (listFilter.state !== 'all' && s.state !== listFilter.state) return false;
    const t = listFilter.text.trim().toLowerCase();
    if (!t) return true;
    const hay = [s.name, s.id, ...Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`)];
    return hay.some(x => typeof x === 'string' && x.toLowerCase().includes(t));
  }

  function leaseLeft(s) {
    const end = toDate(s.leaseEndsAt);
    if (s.state !== 'running' || !end) return DASH;
    return fmtSpan((end.getTime() - Date.now()) / 1000);
  }

  function sandboxTable(list) {
    return table([
      {t: 'Name', v: s => routeLink('sandboxes', s.id, s.name || s.id), cls: 'name'},
      {t: 'ID', v: s => el('code', {text: s.id})},
      {t: 'State', v: s => badge(s.state)},
      {t: 'Driver', v: s => s.driver},
      {t: 'Image', v: s => s.image},
      {t: 'Age', v: s => (toDate(s.createdAt) ? fmtSpan((Date.now() - toDate(s.createdAt).getTime()) / 1000) : DASH)},
      {t: 'Lease left', v: leaseLeft},
      {t: 'Cost so far', v: s => dollars(s.costMicros), cls: 'num'},
      {t: 'Labels', v: s => labelsText(s.labels), cls: 'labels'},
    ], list, {testid: 'sandbox-row', empty: 'No sandboxes match.', key: s => s.id,
      row: (tr, s) => { tr.dataset.id = String(s.id); }});
  }

  async function pageSandboxes(p, main) {
    setTitle('Sandboxes');
    const stateSel = el('select', {testid: 'state-filter'},
      ['all', ...STATES].map(s => el('option', {value: s, text: s, selected: s === listFilter.state})));
    const textBox = el('input', {type: 'search', placeholder: 'name, id or label', testid: 'sandbox-filter',
      value: listFilter.text});
    const count = el('span', {class: 'muted count'});
    const body = el('div', null, loading());
    let last = null;
    const draw = () => {
      if (!last) return;
      const shown = last.filter(matchesFilter).reverse(); // newest first
      count.textContent = `${shown.length} of ${last.length}`;
      patch(body, sandboxTable(shown));
    };
    stateSel.addEventListener('change', () => { listFilter.state = stateSel.value; draw(); });
    textBox.addEventListener('input', () => { listFilter.text = textBox.value; draw(); });
    append(main, el('h1', {text: 'Sandboxes'}),
      el('div', {class: 'toolbar'}, labeled('State', stateSel), labeled('Filter', textBox), count), body);
    const refresh = () => guarded(p, body, async () => {
      const list = await allSandboxes();
      if (!alive(p)) return;
      last = list;
      draw();
    });
    await refresh();
    live(p, 3000, refresh);
  }

  // ---------------------------------------------------------------- One sandbox

  function sandboxDetails(s) {
    const net = s.network && typeof s.network === 'object' ? s.network : null;
    const known = ['id', 'name', 'state', 'driver', 'image', 'vcpu', 'memoryMiB', 'diskMiB', 'createdAt', 'startedAt',
      'stoppedAt', 'pausedAt', 'leaseEndsAt', 'costMicros', 'costMicrosPerHour', 'runSeconds', 'failureReason', 'labels',
      'network', 'user', 'timeoutSeconds', 'onLeaseEnd'];
    const pairs = [
      ['Name', s.name], ['ID', el('code', {text: s.id})], ['State', badge(s.state)], ['Driver', s.driver],
      ['Image', s.image], ['vCPU', s.vcpu],
      ['Memory', s.memoryMiB === undefined || s.memoryMiB === null ? null : `${s.memoryMiB} MiB`],
      ['Disk', s.diskMiB === undefined || s.diskMiB === null ? null : `${s.diskMiB} MiB`],
      ['Created', timeCell(s.createdAt)], ['Started', timeCell(s.startedAt)], ['Stopped', timeCell(s.stoppedAt)],
      ['Paused', timeCell(s.pausedAt)], ['Lease ends', timeCell(s.leaseEndsAt)],
      ['Cost so far', dollars(s.costMicros)],
      ['Price', s.costMicrosPerHour === undefined || s.costMicrosPerHour === null ? null : dollars(s.costMicrosPerHour) + ' / hour'],
      ['Run seconds', s.runSeconds], ['Lease length', s.timeoutSeconds === undefined ? null : `${s.timeoutSeconds} s`],
      ['On lease end', s.onLeaseEnd], ['User', s.user],
      ['Failure reason', s.failureReason ? el('pre', {class: 'reason', text: String(s.failureReason)}) : null],
      ['Labels', labelsText(s.labels)],
      ['Network', net ? `internet: ${yesNo(net.internet)}; allow: ${(net.allow || []).join(', ') || DASH}; ` +
        `deny: ${(net.deny || []).join(', ') || DASH}` : null],
    ];
    const rest = otherFields(s, known);
    if (rest) pairs.push(['Other', el('span', {class: 'small', text: rest})]);
    return kvTable(pairs);
  }

  async function pageSandbox(p, main, id) {
    setTitle('Sandbox');
    const h1 = el('h1', {text: 'Sandbox'});
    append(main, el('p', {class: 'crumbs'}, staticLink('sandboxes', 'Sandboxes'), ' / ', el('code', {text: id})), h1);
    if (!ID_RE.test(id)) {
      append(main, errorBox(new Error('That is not a sandbox id.')));
      return;
    }
    setTitle(id);
    const details = section('Details', 'sandbox-details');
    const full = me && me.access === 'full';
    const actions = full ? section('Actions', 'sandbox-actions') : null;
    const commands = section('Commands', 'sandbox-commands');
    const procs = section('Processes', 'sandbox-processes');
    const metrics = section('Metrics', 'sandbox-metrics');
    const egress = section('Egress', 'sandbox-egress');
    const files = section('Files', 'sandbox-files');
    const events = section('Events', 'sandbox-events');
    append(main, el('div', {class: 'columns'},
      el('div', {class: 'col'}, details.el, actions && actions.el),
      el('div', {class: 'col wide'}, commands.el)),
    procs.el, metrics.el, egress.el, files.el, events.el);

    const act = actions ? actionsPanel(p, id, actions.body, () => loadDetails()) : null;
    const loadDetails = () => guarded(p, details.body, async () => {
      const s = await api(sbx(id));
      if (!alive(p)) return;
      h1.textContent = s.name ? `Sandbox ${s.name}` : 'Sandbox';
      fill(details.body, sandboxDetails(s));
      if (act) act.update(s);
      filesView.update(s.state);
    });
    const loadCommands = () => guarded(p, commands.body, async () => {
      const r = await api(url('/v1/audit', {sandboxId: id, limit: 100}));
      if (alive(p)) patch(commands.body, commandTable(Array.isArray(r.events) ? r.events : []));
    });
    const loadProcs = () => guarded(p, procs.body, async () => {
      const r = await api(sbx(id, '/processes'));
      if (alive(p)) patch(procs.body, processTable(Array.isArray(r.data) ? r.data.slice().reverse() : []));
    });
    const loadEgress = () => guarded(p, egress.body, async () => {
      const r = await api(url(sbx(id, '/egress'), {limit: 200}));
      if (alive(p)) fill(egress.body, egressTable(Array.isArray(r.entries) ? r.entries : []));
    });
    const loadEvents = () => guarded(p, events.body, async () => {
      const r = await api(url('/v1/events', {resourceId: id, limit: 50}));
      if (alive(p)) patch(events.body, eventTable(Array.isArray(r.data) ? r.data : []));
    });
    const charts = metricsPanel(p, id, metrics.body);
    const filesView = filesPanel(p, id, files.body);

    // Details, commands and processes every 5 s; the rest every 30 s (the charts every 5 s until they have a reading).
    const fast = () => Promise.all([loadDetails(), loadCommands(), loadProcs(), charts.waiting() ? charts.load() : null]);
    const slow = () => Promise.all([charts.waiting() ? null : charts.load(), loadEgress(), loadEvents()]);
    await Promise.all([loadDetails(), loadCommands(), loadProcs(), charts.load(), loadEgress(), loadEvents()]);
    live(p, 5000, fast);
    live(p, 30000, slow);
  }

  // Stop and Delete (full keys only: with a read key this is never built).
  function actionsPanel(p, id, body, reload) {
    const result = el('div', {class: 'action-result', testid: 'action-result', 'aria-live': 'polite'});
    const buttons = el('div', {class: 'buttons'});
    const stop = el('button', {type: 'button', class: 'warn', text: 'Stop', testid: 'stop-button'});
    const del = el('button', {type: 'button', class: 'danger', text: 'Delete', testid: 'delete-button'});
    let name = id;
    stop.addEventListener('click', async () => {
      stop.disabled = true;
      fill(result, el('p', {class: 'muted', text: 'Stopping\u2026'}));
      try {
        const s = await api(sbx(id, ':stop'), {method: 'POST', body: {}});
        if (!alive(p)) return;
        fill(result, el('p', {class: 'ok', text: `Stopped: the sandbox is ${s.state || 'stopped'}.`}));
        await reload();
      } catch (e) {
        if (alive(p)) fill(result, errorBox(e));
      } finally {
        stop.disabled = false;
      }
    });
    del.addEventListener('click', async () => {
      if (!window.confirm(`Delete sandbox ${name}? Its files are removed and cannot be brought back.`)) return;
      del.disabled = true;
      fill(result, el('p', {class: 'muted', text: 'Deleting\u2026'}));
      try {
        await api(sbx(id), {method: 'DELETE'});
        if (alive(p)) location.hash = '#/sandboxes';
      } catch (e) {
        if (alive(p)) fill(result, errorBox(e));
        del.disabled = false;
      }
    });
    fill(body, buttons, result);
    return {
      // The Stop button is there only while the sandbox runs or is paused.
      update(s) {
        name = s.name ? `${s.name} (${id})` : id;
        const canStop = s.state === 'running' || s.state === 'paused';
        fill(buttons, canStop ? stop : null, del);
      },
    };
  }

  function commandTable(events) {
    return table([
      {t: 'Time', v: e => timeCell(e.time)},
      {t: 'Action', v: e => e.action},
      {t: 'Command or path', v: e => {
        const d = e.detail && typeof e.detail === 'object' ? e.detail : {};
        const text = typeof d.command === 'string' ? d.command : typeof d.path === 'string' ? d.path :
          otherFields(d, ['exitCode']);
        return text ? el('code', {class: 'cmd', text}) : null;
      }},
      {t: 'Exit code', v: e => (e.detail && e.detail.exitCode !== undefined && e.detail.exitCode !== null ?
        String(e.detail.exitCode) : DASH), cls: 'num'},
      {t: 'HTTP status', v: e => (e.status === undefined ? null : String(e.status)), cls: 'num'},
    ], events, {testid: 'command-row', empty: 'No commands yet.', key: e => e.id});
  }

  function processTable(list) {
    return table([
      {t: 'ID', v: x => el('code', {text: x.id})},
      {t: 'Command', v: x => el('code', {class: 'cmd',
        text: typeof x.command === 'string' ? x.command : Array.isArray(x.argv) ? x.argv.join(' ') : ''})},
      {t: 'User', v: x => x.user},
      {t: 'State', v: x => badge(x.state)},
      {t: 'Exit code', v: x => (x.exitCode === null || x.exitCode === undefined ? DASH : String(x.exitCode)), cls: 'num'},
      {t: 'PID', v: x => x.pid, cls: 'num'},
      {t: 'Started', v: x => timeCell(x.startedAt)},
      {t: 'Ended', v: x => timeCell(x.endedAt)},
      {t: 'Output', v: x => bytes(x.outputBytes), cls: 'num'},
    ], list, {testid: 'process-row', empty: 'No processes.', key: x => x.id});
  }

  function egressTable(entries) {
    return table([
      {t: 'Time', v: e => timeCell(e.at)},
      {t: 'Host', v: e => e.host},
      {t: 'Port', v: e => e.port, cls: 'num'},
      {t: 'Allowed', v: e => badge(e.allowed === true ? 'allowed' : e.allowed === false ? 'refused' : null)},
      {t: 'Reason', v: e => e.reason, cls: 'text'},
      {t: 'Rule', v: e => e.rule},
      {t: 'Bytes out', v: e => bytes(e.bytesOut), cls: 'num'},
      {t: 'Bytes in', v: e => bytes(e.bytesIn), cls: 'num'},
    ], entries, {testid: 'egress-row', empty: 'No connections out.'});
  }

  // names: sandbox id -> name, to show beside a sandbox's id (optional).
  function eventTable(list, names) {
    const resource = e => {
      if (e.resourceType !== 'sandbox') return e.resourceId;
      const name = names && names.get(e.resourceId);
      return [routeLink('sandboxes', e.resourceId), name ? el('span', {class: 'muted res-name', text: ' ' + name}) : null];
    };
    return table([
      {t: 'Time', v: e => timeCell(e.time)},
      {t: 'Type', v: e => e.type},
      {t: 'Resource', v: resource},
      {t: 'Key', v: e => (e.keyId ? el('code', {text: e.keyId}) : null)},
      {t: 'Host', v: e => e.hostId},
      {t: 'Data', v: e => (e.data === undefined ? null : el('code', {class: 'small', text: asText(e.data)}))},
    ], list, {testid: 'event-row', empty: 'No events.', key: e => e.id});
  }

  // ---------------------------------------------------------------- Metrics and charts

  const RANGES = ['15m', '1h', '6h', '24h', '7d'];
  const CW = 320;
  const CH = 120;

  // A small line chart: series [{name, cls, pts: [[ms, value], ...]}], values formatted by fmt.
  // Without a point it is only the text "no readings yet" (no <svg> until there is something to draw).
  function lineChart(series, fmt, longRange, floor) {
    const L = 56;
    const R = 8;
    const T = 8;
    const B = 18;
    const pts = series.flatMap(x => x.pts);
    if (!pts.length) return el('div', {class: 'chart-empty', text: 'no readings yet'});
    const s = svg('svg', {viewBox: `0 0 ${CW} ${CH}`, width: CW, height: CH, class: 'chart', role: 'img'});
    let t0 = Math.min(...pts.map(q => q[0]));
    let t1 = Math.max(...pts.map(q => q[0]));
    if (t1 === t0) { t0 -= 30000; t1 += 30000; }
    const vmax = Math.max(...pts.map(q => q[1]), floor || 0) || 1;
    const x = t => L + (t - t0) / (t1 - t0) * (CW - L - R);
    const y = v => T + (1 - v / vmax) * (CH - T - B);
    const tlabel = ms => {
      const d = new Date(ms);
      const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
      return longRange ? `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hm}` : hm;
    };
    append(s,
      svg('line', {x1: L, y1: T, x2: L, y2: CH - B, class: 'axis'}),
      svg('line', {x1: L, y1: CH - B, x2: CW - R, y2: CH - B, class: 'axis'}),
      svg('line', {x1: L, y1: T, x2: CW - R, y2: T, class: 'grid-line'}),
      svg('text', {x: L - 4, y: T + 4, class: 'tick', 'text-anchor': 'end', text: fmt(vmax)}),
      svg('text', {x: L - 4, y: CH - B, class: 'tick', 'text-anchor': 'end', text: fmt(0)}),
      svg('text', {x: L, y: CH - 4, class: 'tick', 'text-anchor': 'start', text: tlabel(t0)}),
      svg('text', {x: CW - R, y: CH - 4, class: 'tick', 'text-anchor': 'end', text: tlabel(t1)}));
    for (const ser of series) {
      if (!ser.pts.length) continue;
      if (ser.pts.length === 1) {
        const [t, v] = ser.pts[0];
        append(s, svg('circle', {cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 3, class: 'pt ' + ser.cls}));
      } else {
        const coords = ser.pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
        append(s, svg('polyline', {points: coords, class: 'line ' + ser.cls}));
      }
    }
    return s;
  }

  // A chart with its title and a line of min / max / last under it.
  function chartFigure(title, series, fmt, longRange, testid, floor) {
    const vals = series.flatMap(x => x.pts.map(q => q[1]));
    const summary = series.map(ser => {
      if (!ser.pts.length) return null;
      const v = ser.pts.map(q => q[1]);
      const prefix = series.length > 1 ? ser.name + ': ' : '';
      return `${prefix}min ${fmt(Math.min(...v))}, max ${fmt(Math.max(...v))}, last ${fmt(v[v.length - 1])}`;
    }).filter(Boolean).join(' \u00b7 ');
    return el('figure', {class: 'chart-box', testid},
      el('figcaption', null, el('span', {class: 'chart-title', text: title}),
        series.length > 1 ? series.map(ser => el('span', {class: 'legend-item'},
          el('span', {class: 'swatch ' + ser.cls}), ser.name)) : null),
      lineChart(series, fmt, longRange, floor),
      vals.length ? el('p', {class: 'chart-summary small muted', text: summary}) : null);
  }

  function seriesOf(points, field) {
    const out = [];
    for (const pt of points) {
      const t = toDate(pt.at);
      const v = pt[field];
      if (t && typeof v === 'number' && Number.isFinite(v)) out.push([t.getTime(), v]);
    }
    return out;
  }

  function pct(v) {
    return (v >= 10 || v === 0 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(2)) + '%';
  }

  // The metrics section: a range select, four charts and the latest reading. Returns its loader,
  // and whether the CPU chart still waits for a reading (the page then asks again sooner).
  function metricsPanel(p, id, body) {
    let range = '1h';
    let cpuEmpty = true;
    const sel = el('select', {testid: 'metrics-range'}, RANGES.map(r => el('option', {value: r, text: r, selected: r === range})));
    const charts = el('div', {class: 'charts'}, loading());
    const latest = el('div', {class: 'latest'});
    fill(body, el('div', {class: 'toolbar'}, labeled('Range', sel)), charts, latest);
    const load = () => guarded(p, charts, async () => {
      const r = await api(url(sbx(id, '/metrics'), {range}));
      if (!alive(p)) return;
      const pts = Array.isArray(r.points) ? r.points : [];
      const long = range === '24h' || range === '7d';
      const vcpu = r.vcpu ? ` of ${r.vcpu} vCPU` : '';
      const cpu = seriesOf(pts, 'cpuPercent'); // null (left out) for a first reading alone
      cpuEmpty = !cpu.length;
      fill(charts,
        chartFigure('CPU' + vcpu, [{name: 'cpu', cls: 's0', pts: cpu}], pct, long, 'cpu-chart', 1),
        chartFigure('Memory', [{name: 'memory', cls: 's1', pts: seriesOf(pts, 'memoryBytes')}], bytes, long, 'memory-chart'),
        chartFigure('Disk', [{name: 'disk', cls: 's2', pts: seriesOf(pts, 'diskBytes')}], bytes, long, 'disk-chart'),
        chartFigure('Network', [{name: 'in', cls: 's3', pts: seriesOf(pts, 'networkInBytes')},
          {name: 'out', cls: 's4', pts: seriesOf(pts, 'networkOutBytes')}], bytes, long, 'network-chart'));
      const l = r.latest && typeof r.latest === 'object' ? r.latest : null;
      fill(latest, el('h3', {text: 'Latest reading'}), l ? kvTable([
        ['At', timeCell(l.at)],
        ['CPU', typeof l.cpuPercent === 'number' ? pct(l.cpuPercent) + (typeof l.cpuCores === 'number' ? ` (${l.cpuCores.toFixed(2)} cores)` : '') : null],
        ['Memory', bytes(l.memoryBytes) + (r.memoryLimitBytes ? ' of ' + bytes(r.memoryLimitBytes) : '')],
        ['Disk', bytes(l.diskBytes) + (r.diskLimitBytes ? ' of ' + bytes(r.diskLimitBytes) : '')],
        ['Network in', bytes(l.networkInBytes)], ['Network out', bytes(l.networkOutBytes)],
      ]) : el('p', {class: 'muted', text: 'no readings yet'}));
    });
    sel.addEventListener('change', () => { range = sel.value; load(); });
    return {load, waiting: () => cpuEmpty};
  }

  // ---------------------------------------------------------------- Files

  function parentOf(path) {
    const s = path.replace(/\/+$/, '');
    const i = s.lastIndexOf('/');
    return i <= 0 ? '/' : s.slice(0, i);
  }

  function basename(path) {
    const s = String(path).replace(/\/+$/, '');
    return s.slice(s.lastIndexOf('/') + 1) || 'download';
  }

  // Fetches a file with the key, then saves it through a temporary object URL.
  async function download(id, path) {
    const res = await api(url(sbx(id, '/files/content'), {path}), {raw: true});
    const blob = await res.blob();
    const href = URL.createObjectURL(blob);
    const a = document.createElement('a');
    a.href = href;  // our own blob: URL, never a server value
    a.download = basename(path);
    a.hidden = true;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(href), 30000);
  }

  function filesPanel(p, id, body) {
    let path = '/workspace';
    const box = el('input', {type: 'text', value: path, testid: 'file-path', spellcheck: 'false', class: 'path'});
    const form = el('form', {class: 'toolbar', autocomplete: 'off'}, labeled('Path', box),
      el('button', {type: 'submit', text: 'Open'}));
    const status = el('div', {class: 'file-status', 'aria-live': 'polite'});
    const list = el('div', null, loading());
    fill(body, form, status, list);
    let started = false; // the list was asked for (by the sandbox running, or a person)
    const open = target => {
      started = true;
      path = target;
      box.value = target;
      load();
    };
    const load = () => guarded(p, list, async () => {
      const want = path;
      const r = await api(url(sbx(id, '/files/list'), {path: want}));
      if (!alive(p) || want !== path) return;
      if (typeof r.path === 'string' && r.path) { path = r.path; box.value = r.path; }
      const entries = (Array.isArray(r.data) ? r.data : []).slice().sort((a, b) =>
        (a.type === 'directory' ? 0 : 1) - (b.type === 'directory' ? 0 : 1) || String(a.name).localeCompare(String(b.name)));
      const up = el('button', {type: 'button', class: 'link', text: '..'});
      up.addEventListener('click', () => open(parentOf(path)));
      const rows = table([
        {t: 'Name', v: e => nameCell(e)},
        {t: 'Type', v: e => e.type},
        {t: 'Size', v: e => (e.type === 'file' ? bytes(e.size) : null), cls: 'num'},
        {t: 'Mode', v: e => e.mode},
        {t: 'Modified', v: e => timeCell(e.modifiedAt || e.mtime)},
      ], entries, {testid: 'file-row', empty: 'This directory is empty.'});
      fill(list, path !== '/' ? el('p', {class: 'up'}, up, ' (up to ', el('code', {text: parentOf(path)}), ')') : null,
        rows, r.truncated ? el('p', {class: 'muted', text: 'More entries were left out.'}) : null);
    });
    const nameCell = e => {
      const name = String(e.name === undefined ? basename(e.path || '') : e.name);
      const full = typeof e.path === 'string' ? e.path : (path.replace(/\/+$/, '') + '/' + name);
      if (e.type === 'directory') {
        const b = el('button', {type: 'button', class: 'link dir', text: name + '/'});
        b.addEventListener('click', () => open(full));
        return b;
      }
      if (e.type === 'file') {
        const b = el('button', {type: 'button', class: 'link file', text: name});
        b.addEventListener('click', async () => {
          b.disabled = true;
          fill(status, el('p', {class: 'muted'}, 'Downloading ', el('code', {text: name}), '\u2026'));
          try {
            await download(id, full);
            if (alive(p)) fill(status);
          } catch (err) {
            if (alive(p)) fill(status, errorBox(err));
          } finally {
            b.disabled = false;
          }
        });
        return el('span', null, b, ' ', el('span', {class: 'muted small', text: 'download'}));
      }
      const target = e.symlinkTarget || e.target;
      return el('span', null, name, target ? el('span', {class: 'muted'}, ' \u2192 ', String(target)) : null);
    };
    form.addEventListener('submit', ev => {
      ev.preventDefault();
      open(box.value.trim() || '/workspace');
    });
    // A files call wakes a paused sandbox (autoWake) and is refused on a stopped one, so the
    // list opens by itself only once the sandbox is seen running; otherwise on a click.
    return {
      update(state) {
        if (started) return;
        if (state === 'running') {
          started = true;
          load();
        } else if (state === 'paused') {
          const wake = el('button', {type: 'button', text: 'List files (wakes the sandbox)'});
          wake.addEventListener('click', () => { started = true; load(); });
          fill(list, el('p', {class: 'muted', text: 'The sandbox is paused: listing its files would wake it. '}), wake);
        } else {
          fill(list, el('p', {class: 'muted', text: `The sandbox is ${state || 'not running'}: its files can be read once it runs.`}));
        }
      },
    };
  }

  // ---------------------------------------------------------------- Spending

  const PALETTE = 8; // classes k0 .. k7 in app.css

  async function pageSpending(p, main) {
    setTitle('Spending');
    const chartBox = el('div', {class: 'spending-chart', testid: 'spending-chart'}, loading());
    const tableBox = el('div');
    const limitsBox = el('div', null, loading());
    append(main, el('h1', {text: 'Spending'}),
      el('p', {class: 'muted', text: 'What each key of this owner spent per UTC day over the last 14 days.'}),
      el('section', {class: 'card'}, el('h2', {text: 'Last 14 days'}), chartBox, tableBox),
      el('section', {class: 'card'}, el('h2', {text: 'Today\u2019s limit of this key'}), limitsBox));

    const loadLimits = guarded(p, limitsBox, async () => {
      const l = await api('/v1/limits');
      if (!alive(p)) return null;
      const d = l.daily || {};
      fill(limitsBox, kvTable([
        ['Used', dollars(d.usedMicros)], ['Remaining', d.remainingMicros === null ? 'unlimited' : dollars(d.remainingMicros)],
        ['Limit', d.limitMicros === null ? 'unlimited' : dollars(d.limitMicros)],
        ['Settled', dollars(d.settledMicros)], ['Reserved', dollars(d.reservedMicros)],
        ['Window', d.windowSeconds ? fmtSpan(d.windowSeconds) : null], ['Frees at', timeCell(d.freesAt)],
      ]));
      return l;
    });

    await guarded(p, chartBox, async () => {
      const now = Math.floor(Date.now() / 1000);
      const today = Math.floor(now / 86400) * 86400;
      const days = [];
      for (let i = 13; i >= 0; i--) {
        const since = today - i * 86400;
        days.push({since, until: i === 0 ? Math.max(now, since + 1) : since + 86400});
      }
      const answers = await Promise.all(days.map(d => api(url('/v1/usage', {since: d.since, until: d.until}))));
      await loadLimits;
      if (!alive(p)) return;
      // The keys, biggest spender first, with a stable colour each.
      const names = new Map();
      const totals = new Map();
      days.forEach((d, i) => {
        d.byKey = new Map();
        for (const k of Array.isArray(answers[i].keys) ? answers[i].keys : []) {
          const m = Number(k.micros) || 0;
          d.byKey.set(k.keyId, (d.byKey.get(k.keyId) || 0) + m);
          if (!names.has(k.keyId) || !names.get(k.keyId)) names.set(k.keyId, k.name || k.keyId);
          totals.set(k.keyId, (totals.get(k.keyId) || 0) + m);
        }
      });
      const keys = [...totals.keys()].sort((a, b) => totals.get(b) - totals.get(a));
      const limits = me && me.limits && me.limits.daily ? me.limits.daily : {};
      const limit = typeof limits.limitMicros === 'number' ? limits.limitMicros : null;
      fill(chartBox, spendingChart(days, keys, names, limit),
        el('div', {class: 'legend'}, keys.map((k, i) => el('span', {class: 'legend-item'},
          el('span', {class: 'swatch k' + (i % PALETTE)}), String(names.get(k) || k))),
        limit !== null ? el('span', {class: 'legend-item'}, el('span', {class: 'swatch limit'}),
          'daily limit of this key (' + dollars(limit) + ')') : null,
        keys.length ? null : el('span', {class: 'muted', text: 'Nothing spent in these days.'})));
      fill(tableBox, table([
        {t: 'Day (UTC)', v: d => dayLabel(d.since, true)},
        ...keys.map(k => ({t: String(names.get(k) || k), v: d => dollars(d.byKey.get(k) || 0), cls: 'num'})),
        {t: 'Total', v: d => dollars([...d.byKey.values()].reduce((a, b) => a + b, 0)), cls: 'num total'},
      ], days.slice().reverse(), {testid: 'spending-row'}));
    });
  }

  function dayLabel(unix, year) {
    const d = new Date(unix * 1000);
    const md = `${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
    return year ? `${d.getUTCFullYear()}-${md}` : md;
  }

  // One stacked bar per day, one colour per key, and the daily limit as a dashed line.
  function spendingChart(days, keys, names, limit) {
    const W = 720;
    const H = 240;
    const L = 64;
    const R = 12;
    const T = 14;
    const B = 22;
    const totals = days.map(d => [...d.byKey.values()].reduce((a, b) => a + b, 0));
    const vmax = Math.max(...totals, limit || 0) || 1;
    const y = v => T + (1 - v / vmax) * (H - T - B);
    const slot = (W - L - R) / days.length;
    const bw = Math.max(4, slot * 0.7);
    const s = svg('svg', {viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: 'chart bars', role: 'img'},
      svg('title', {text: 'Spending per day and key'}),
      svg('line', {x1: L, y1: T, x2: L, y2: H - B, class: 'axis'}),
      svg('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis'}),
      svg('text', {x: L - 4, y: T + 4, class: 'tick', 'text-anchor': 'end', text: dollars(vmax)}),
      svg('text', {x: L - 4, y: H - B, class: 'tick', 'text-anchor': 'end', text: '$0'}));
    days.forEach((d, i) => {
      const x0 = L + i * slot + (slot - bw) / 2;
      let base = 0;
      keys.forEach((k, ki) => {
        const m = d.byKey.get(k) || 0;
        if (m <= 0) return;
        const top = y(base + m);
        const h = Math.max(1, y(base) - top);
        append(s, svg('rect', {x: x0.toFixed(1), y: (y(base) - h).toFixed(1), width: bw.toFixed(1), height: h.toFixed(1),
          class: 'bar k' + (ki % PALETTE)}, svg('title', {text: `${dayLabel(d.since, true)} ${names.get(k) || k}: ${dollars(m)}`})));
        base += m;
      });
      if ((days.length - 1 - i) % 2 === 0) { // every other day, today's included
        append(s, svg('text', {x: (x0 + bw / 2).toFixed(1), y: H - 6, class: 'tick', 'text-anchor': 'middle',
          text: dayLabel(d.since, false)}));
      }
    });
    if (limit !== null) {
      const ly = y(limit).toFixed(1);
      append(s, svg('line', {x1: L, y1: ly, x2: W - R, y2: ly, class: 'limit-line'}),
        svg('text', {x: L + 6, y: Math.max(10, y(limit) - 4).toFixed(1), class: 'limit-label', 'text-anchor': 'start',
          text: 'daily limit of this key'}));
    }
    return s;
  }

  // ---------------------------------------------------------------- Keys

  async function pageKeys(p, main) {
    setTitle('Keys');
    append(main, el('h1', {text: 'Keys'}));
    if (!me || me.access !== 'full') {
      append(main, el('p', {class: 'notice', testid: 'keys-read-only', text: 'A read-only key cannot list keys.'}));
      return;
    }
    const body = el('div', null, loading());
    append(main, body);
    await guarded(p, body, async () => {
      const r = await api('/v1/keys');
      if (!alive(p)) return;
      const known = ['id', 'name', 'access', 'owner', 'createdAt', 'lastUsedAt', 'revokedAt', 'dailyLimitMicros', 'trial'];
      fill(body, table([
        {t: 'ID', v: k => el('code', {text: k.id})},
        {t: 'Name', v: k => k.name},
        {t: 'Access', v: k => badge(k.access)},
        {t: 'Owner', v: k => k.owner},
        {t: 'Created', v: k => timeCell(k.createdAt)},
        {t: 'Last used', v: k => timeCell(k.lastUsedAt)},
        {t: 'Revoked', v: k => (k.revokedAt ? timeCell(k.revokedAt) : 'no')},
        {t: 'Daily limit', v: k => (k.dailyLimitMicros === null || k.dailyLimitMicros === undefined ? 'unlimited' :
          dollars(k.dailyLimitMicros)), cls: 'num'},
        {t: 'Trial', v: k => yesNo(k.trial)},
        {t: 'Other', v: k => otherFields(k, known), cls: 'small'},
      ], Array.isArray(r.keys) ? r.keys : [], {testid: 'key-row', empty: 'No keys.',
        row: (tr, k) => { if (k.revokedAt) tr.classList.add('revoked'); }}));
    });
  }

  // ---------------------------------------------------------------- Images, snapshots

  async function pageImages(p, main) {
    setTitle('Images');
    const body = el('div', null, loading());
    append(main, el('h1', {text: 'Images'}), body);
    await guarded(p, body, async () => {
      const r = await api('/v1/images');
      if (!alive(p)) return;
      fill(body, table([
        {t: 'Name', v: i => i.name},
        {t: 'Built', v: i => yesNo(i.built)},
        {t: 'Built at', v: i => timeCell(i.builtAt)},
        {t: 'Size', v: i => bytes(i.sizeBytes), cls: 'num'},
        {t: 'Other', v: i => otherFields(i, ['name', 'built', 'builtAt', 'sizeBytes']), cls: 'small'},
      ], Array.isArray(r.images) ? r.images : [], {testid: 'image-row', empty: 'No images.'}));
    });
  }

  async function pageSnapshots(p, main) {
    setTitle('Snapshots');
    const body = el('div', null, loading());
    append(main, el('h1', {text: 'Snapshots'}), body);
    await guarded(p, body, async () => {
      const list = [];
      let cursor = null;
      for (let i = 0; i < 10; i++) {
        const r = await api(url('/v1/snapshots', {limit: 100, cursor}));
        list.push(...(Array.isArray(r.data) ? r.data : []));
        cursor = r.nextCursor;
        if (!cursor) break;
      }
      if (!alive(p)) return;
      const known = ['id', 'name', 'state', 'mode', 'sandboxId', 'sourceSandboxId', 'sizeBytes', 'createdAt', 'expiresAt',
        'retentionDays', 'driver', 'image', 'diskMiB', 'labels', 'error'];
      fill(body, table([
        {t: 'ID', v: x => el('code', {text: x.id})},
        {t: 'Name', v: x => x.name},
        {t: 'State', v: x => badge(x.state)},
        {t: 'Mode', v: x => x.mode},
        {t: 'Sandbox', v: x => (x.sandboxId ? routeLink('sandboxes', x.sandboxId) : null)},
        {t: 'Size', v: x => bytes(x.sizeBytes), cls: 'num'},
        {t: 'Created', v: x => timeCell(x.createdAt)},
        {t: 'Expires', v: x => timeCell(x.expiresAt)},
        {t: 'Driver', v: x => x.driver},
        {t: 'Image', v: x => x.image},
        {t: 'Labels', v: x => labelsText(x.labels)},
        {t: 'Error', v: x => (x.error ? asText(x.error) : null), cls: 'text'},
        {t: 'Other', v: x => otherFields(x, known), cls: 'small'},
      ], list.reverse(), {testid: 'snapshot-row', empty: 'No snapshots.'}));
    });
  }

  // ---------------------------------------------------------------- Webhooks

  const WEBHOOK_KNOWN = ['id', 'url', 'events', 'description', 'enabled', 'createdAt', 'updatedAt', 'previousSecretExpiresAt'];

  function eventsText(ev) {
    return Array.isArray(ev) && ev.length ? ev.join(', ') : 'every event';
  }

  async function pageWebhooks(p, main) {
    setTitle('Webhooks');
    const body = el('div', null, loading());
    append(main, el('h1', {text: 'Webhooks'}), body);
    await guarded(p, body, async () => {
      const r = await api('/v1/webhooks');
      if (!alive(p)) return;
      fill(body, table([
        {t: 'ID', v: w => routeLink('webhooks', w.id)},
        {t: 'URL', v: w => el('code', {class: 'url', text: asText(w.url)})}, // text only, never a link
        {t: 'Events', v: w => eventsText(w.events)},
        {t: 'Description', v: w => w.description, cls: 'text'},
        {t: 'Enabled', v: w => yesNo(w.enabled)},
        {t: 'Created', v: w => timeCell(w.createdAt)},
        {t: 'Updated', v: w => timeCell(w.updatedAt)},
      ], Array.isArray(r.data) ? r.data : [], {testid: 'webhook-row', empty: 'No webhooks.'}));
    });
  }

  async function pageWebhook(p, main, id) {
    setTitle('Webhook');
    append(main, el('p', {class: 'crumbs'}, staticLink('webhooks', 'Webhooks'), ' / ', el('code', {text: id})),
      el('h1', {text: 'Webhook'}));
    if (!ID_RE.test(id)) {
      append(main, errorBox(new Error('That is not a webhook id.')));
      return;
    }
    const info = section('Webhook', 'webhook-details');
    const deliveries = section('Deliveries', 'webhook-deliveries');
    append(main, info.el, deliveries.el);
    const base = '/v1/webhooks/' + encodeURIComponent(id);
    await Promise.all([
      guarded(p, info.body, async () => {
        const w = await api(base);
        if (!alive(p)) return;
        const rest = otherFields(w, WEBHOOK_KNOWN);
        fill(info.body, kvTable([
          ['ID', el('code', {text: w.id})], ['URL', el('code', {class: 'url', text: asText(w.url)})],
          ['Events', eventsText(w.events)], ['Description', w.description], ['Enabled', yesNo(w.enabled)],
          ['Created', timeCell(w.createdAt)], ['Updated', timeCell(w.updatedAt)],
          ['Previous secret expires', timeCell(w.previousSecretExpiresAt)],
          rest ? ['Other', rest] : null,
        ].filter(Boolean)));
      }),
      guarded(p, deliveries.body, async () => {
        const r = await api(url(base + '/deliveries', {limit: 50}));
        if (!alive(p)) return;
        fill(deliveries.body, table([
          {t: 'ID', v: d => el('code', {text: d.id})},
          {t: 'Event type', v: d => d.eventType},
          {t: 'State', v: d => badge(d.state)},
          {t: 'Attempts', v: d => d.attempts, cls: 'num'},
          {t: 'Last status', v: d => (d.responseStatus === null || d.responseStatus === undefined ? null :
            String(d.responseStatus)), cls: 'num'},
          {t: 'Last error', v: d => d.lastError, cls: 'text'},
          {t: 'Next attempt', v: d => timeCell(d.nextAttemptAt)},
          {t: 'Created', v: d => timeCell(d.createdAt)},
          {t: 'Updated', v: d => timeCell(d.updatedAt)},
        ], Array.isArray(r.data) ? r.data : [], {testid: 'delivery-row', empty: 'No deliveries yet.'}));
      }),
    ]);
  }

  // ---------------------------------------------------------------- Events

  const eventsState = {type: ''};

  async function pageEvents(p, main) {
    setTitle('Events');
    const typeBox = el('input', {type: 'search', value: eventsState.type, placeholder: 'e.g. sandbox. or sandbox.stopped',
      testid: 'event-type', spellcheck: 'false'});
    const form = el('form', {class: 'toolbar', autocomplete: 'off'}, labeled('Type', typeBox),
      el('button', {type: 'submit', text: 'Filter'}));
    const newer = el('button', {type: 'button', text: '\u2190 Newer', testid: 'events-newer'});
    const older = el('button', {type: 'button', text: 'Older \u2192', testid: 'events-older'});
    const where = el('span', {class: 'muted'});
    const body = el('div', null, loading());
    append(main, el('h1', {text: 'Events'}), form, body, el('div', {class: 'pager'}, newer, where, older));
    // cursors[i] is the cursor of page i (null: the newest); next is the one after the page shown.
    let cursors = [null];
    let next = null;
    // The names of the sandboxes still there, to show beside their ids (best effort).
    let names = null;
    const loadNames = allSandboxes().then(list => {
      names = new Map(list.filter(s => s.name).map(s => [s.id, String(s.name)]));
    }).catch(() => { names = null; });
    const load = () => guarded(p, body, async () => {
      newer.disabled = older.disabled = true;
      const r = await api(url('/v1/events', {limit: 100, type: eventsState.type, cursor: cursors[cursors.length - 1]}));
      await loadNames;
      if (!alive(p)) return;
      next = typeof r.nextCursor === 'string' || typeof r.nextCursor === 'number' ? String(r.nextCursor) : null;
      fill(body, eventTable(Array.isArray(r.data) ? r.data : [], names));
      newer.disabled = cursors.length <= 1;
      older.disabled = !next;
      where.textContent = `page ${cursors.length}`;
    });
    form.addEventListener('submit', ev => {
      ev.preventDefault();
      eventsState.type = typeBox.value.trim();
      cursors = [null];
      load();
    });
    newer.addEventListener('click', () => { if (cursors.length > 1) { cursors.pop(); load(); } });
    older.addEventListener('click', () => { if (next) { cursors.push(next); load(); } });
    await load();
  }

  // ---------------------------------------------------------------- start

  async function start() {
    if (!root) return;
    if (!sessionStorage.getItem(KEY_STORE)) {
      render();
      return;
    }
    fill(root, el('main', {class: 'signin-page'}, el('h1', {text: 'Runtime dashboard'}), loading()));
    try {
      me = await api('/v1/me');
      render();
    } catch (e) {
      if (me || !sessionStorage.getItem(KEY_STORE)) return; // a 401 already showed the sign-in form
      const retry = el('button', {type: 'button', text: 'Try again'});
      retry.addEventListener('click', start);
      fill(root, el('main', {class: 'signin-page'}, el('h1', {text: 'Runtime dashboard'}), errorBox(e), retry));
    }
  }

  start();
})();
