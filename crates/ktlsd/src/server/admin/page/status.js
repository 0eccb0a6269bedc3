// The ktlsd status page: fetches /status.json every second and builds the page
// with DOM calls. Every string from the document reaches the page through
// textContent or an attribute value, never as markup.
'use strict';
(function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const HISTORY = 900;
  let samples = [];
  let refreshes = 0;

  function el(tag, attrs, kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'text') e.textContent = String(v);
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, String(v));
    }
    for (const kid of kids || []) e.append(kid);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  const num = (n) => (n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US'));
  const rate = (r) => (r === null || r === undefined ? '–' : (r >= 100 ? r.toFixed(0) : r.toFixed(1)));
  const pct = (x) => (x === null || x === undefined ? '–' : (x * 100).toFixed(1) + '%');
  const ms = (x) => (x === null || x === undefined ? '–' : x + ' ms');
  function bytes(n) {
    if (n === null || n === undefined) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + ' ' + units[i];
  }
  const when = (t) => (t ? new Date(t * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') : '–');

  function card(id, label, value, raw) {
    return el('div', { class: 'card' }, [
      el('span', { class: 'label', text: label }),
      el('span', { class: 'value', id: id, 'data-value': raw === null || raw === undefined ? '' : raw, text: value }),
    ]);
  }
  function kv(id, caption, map, fmt) {
    const body = el('tbody');
    for (const [k, v] of Object.entries(map || {})) {
      body.append(el('tr', { 'data-key': k }, [el('td', { text: k }), el('td', { class: 'num', text: (fmt || num)(v) })]));
    }
    if (!body.children.length) body.append(el('tr', {}, [el('td', { class: 'note', text: 'none yet' })]));
    return el('table', { class: 'kv', id: id }, [el('caption', { text: caption }), body]);
  }
  function bar(parts) {
    const s = svg('svg', { viewBox: '0 0 100 10', preserveAspectRatio: 'none', width: '100%', height: '12' });
    let x = 0;
    parts.forEach((p, i) => {
      const w = (p || 0) * 100;
      s.append(svg('rect', { x: x, y: 0, width: w, height: 10, class: 'b' + i, fill: ['#1a7f37', '#0969da', '#bf8700'][i] }));
      x += w;
    });
    return s;
  }

  function renderNow(doc) {
    const n = doc.now;
    const r = n.requests_per_second;
    const c = n.connections;
    document.getElementById('now-cards').replaceChildren(
      card('rps-total', 'requests/s', rate(r.total), r.total),
      card('rps-h1', 'HTTP/1.1 req/s', rate(r.h1), r.h1),
      card('rps-h2', 'HTTP/2 req/s', rate(r.h2), r.h2),
      card('rps-h3', 'HTTP/3 req/s', rate(r.h3), r.h3),
      card('requests-total', 'requests since start', num(n.requests_total.total), n.requests_total.total),
      card('connections-open', 'connections open', num(c.open), c.open),
      card('connections-idle', 'idle (HTTP/1.1)', num(c.idle_h1), c.idle_h1),
      card('connections-handshaking', 'handshaking', num(c.handshaking), c.handshaking),
      card('ktls-share', 'kTLS share (TCP connections)', pct(n.tls.ktls_share), n.tls.ktls_share),
      card('sendfile-share', 'body bytes by sendfile', pct(n.body_bytes.sendfile_share), n.body_bytes.sendfile_share),
    );
    const b = n.body_bytes;
    const paths = el('div', {}, [
      el('strong', { text: 'Body bytes by path' }),
      bar([b.sendfile_share, b.copy_share, b.splice_share]),
      kv('body-bytes', '', { sendfile: b.sendfile, copy: b.copy, splice: b.splice }, bytes),
    ]);
    const ktls = el('p', { class: 'note', id: 'ktls-summary', text: (n.tls.ktls_enabled ? 'kTLS on: ' : 'kTLS off: ') + n.tls.ktls_summary });
    document.getElementById('now-tables').replaceChildren(
      kv('rps-by-site', 'requests/s by site', n.requests_per_second_by_site, rate),
      kv('open-by-layer', 'open connections by record layer', c.by_record_layer),
      kv('open-by-protocol', 'open connections by protocol', c.by_protocol),
      el('div', {}, [kv('tls-layers', 'connections by record layer (since start)', n.tls.connections), ktls]),
      kv('tls-versions', 'TLS versions', n.tls.by_version),
      kv('tls-suites', 'cipher suites', n.tls.by_suite),
      paths,
      kv('errors', 'errors by kind', n.errors),
      kv('handshake-failures', 'handshake failures by reason', n.handshake_failures),
    );
  }

  async function act(action, address) {
    const r = await fetch('/upstreams/' + action + '?upstream=' + encodeURIComponent(address), { method: 'POST' });
    const text = await r.text();
    document.getElementById('error').textContent = r.ok ? '' : action + ' ' + address + ': ' + r.status + ' ' + text;
  }

  function renderUpstreams(doc) {
    document.getElementById('admin-mode').textContent = doc.admin_actions
      ? 'Admin mode: drain and enable ask for the credentials of admin_auth.'
      : 'Read-only: set admin_auth to drain and enable upstreams from here.';
    const body = document.querySelector('#upstreams tbody');
    const rows = doc.upstreams.map((u) => {
      const buttons = el('td');
      if (doc.admin_actions) {
        const action = u.state === 'draining' ? 'enable' : 'drain';
        const b = el('button', { type: 'button', 'data-action': action, text: action });
        b.addEventListener('click', () => act(action, u.address));
        buttons.append(b);
      }
      const errors = Object.entries(u.errors).map(([k, v]) => k + ' ' + v).join(', ');
      return el('tr', { class: 'upstream', 'data-address': u.address, 'data-state': u.state }, [
        el('td', {}, [el('span', { class: 'key', text: u.upstream })]),
        el('td', {}, [el('span', { class: 'state state-' + u.state, text: u.state })]),
        el('td', { class: 'key', text: u.used_by.join('; ') }),
        el('td', { class: 'num', text: num(u.requests) }),
        el('td', { class: 'num', title: errors, text: num(u.errors_total) }),
        el('td', { class: 'num', text: ms(u.latency_ms.p50) }),
        el('td', { class: 'num', text: ms(u.latency_ms.p90) }),
        el('td', { class: 'num', text: ms(u.latency_ms.p99) }),
        el('td', { class: 'num', text: num(u.connections_in_use) }),
        el('td', { class: 'num', text: num(u.connections_idle) }),
        el('td', { text: u.last_check }),
        buttons,
      ]);
    });
    if (!rows.length) rows.push(el('tr', {}, [el('td', { class: 'note', colspan: 12, text: 'no [[proxy]] upstreams' })]));
    body.replaceChildren(...rows);
  }

  function renderCache(doc) {
    const box = document.getElementById('cache');
    const c = doc.cache;
    if (!c) {
      box.replaceChildren(el('p', { class: 'note', id: 'cache-off', text: 'no [cache] configured' }));
      return;
    }
    const hot = el('ol', { id: 'hottest' }, c.hottest.map((h) => el('li', { 'data-hits': h.hits }, [
      el('span', { class: 'key', text: h.key }), document.createTextNode(' — ' + num(h.hits) + ' hits'),
    ])));
    if (!c.hottest.length) hot.append(el('li', { class: 'note', text: 'no hits yet' }));
    box.replaceChildren(
      el('div', { class: 'cards' }, [
        card('cache-hit-ratio', 'hit ratio', pct(c.hit_ratio), c.hit_ratio),
        card('cache-size', 'stored / max_size', bytes(c.bytes) + ' / ' + bytes(c.max_size), c.bytes),
        card('cache-entries', 'entries', num(c.entries), c.entries),
        card('cache-sendfile', 'hit bytes by sendfile', bytes(c.sendfile_bytes), c.sendfile_bytes),
        card('cache-copy', 'hit bytes copied', bytes(c.copy_bytes), c.copy_bytes),
        card('cache-evictions', 'evictions', num(c.evictions), c.evictions),
        card('cache-coalesced', 'coalesced waits', num(c.coalesced), c.coalesced),
      ]),
      bar([c.max_size ? c.bytes / c.max_size : 0]),
      el('h3', { text: 'Hottest keys' }),
      hot,
    );
  }

  function renderSites(doc) {
    const rows = doc.sites.map((s) => {
      const days = s.certificate_days_left;
      const cls = days === null ? '' : days < 7 ? 'expiry-red' : days < 30 ? 'expiry-amber' : 'ok';
      const acme = s.acme ? s.acme.state + (s.acme.last_error ? ' (' + s.acme.last_error + ')' : '') : '–';
      return el('tr', { class: 'site', 'data-name': s.name }, [
        el('td', { class: 'key', text: s.name }),
        el('td', { class: 'key', text: s.names.join(', ') || '(any other name)' }),
        el('td', { text: when(s.certificate_not_after) }),
        el('td', { class: 'num ' + cls, text: days === null ? '–' : days.toFixed(1) }),
        el('td', { text: acme }),
      ]);
    });
    document.querySelector('#sites tbody').replaceChildren(...rows);
    const loads = doc.reloads.recent.slice().reverse().map((r) => el('tr', { class: 'reload' }, [
      el('td', { text: when(r.at) }),
      el('td', { text: r.kind }),
      el('td', { class: r.ok ? 'ok' : 'bad', text: r.ok ? 'loaded' : 'failed: kept the running one' }),
      el('td', { class: 'key', text: r.config_hash || '–' }),
      el('td', { text: r.error || '' }),
    ]));
    document.querySelector('#reloads tbody').replaceChildren(...loads);
  }

  function chart(id, title, key, fmt, fixedMax) {
    const w = 300, h = 80;
    const values = samples.map((s) => s[key]);
    const known = values.filter((v) => v !== null && v !== undefined);
    const max = fixedMax || Math.max(1e-9, ...known) * 1.1;
    const s = svg('svg', { viewBox: '0 0 ' + w + ' ' + h, preserveAspectRatio: 'none', id: id });
    for (const y of [0, h / 2, h]) s.append(svg('line', { x1: 0, x2: w, y1: y, y2: y }));
    const step = w / (HISTORY - 1);
    const start = HISTORY - samples.length;
    let points = [];
    const flush = () => {
      if (points.length) s.append(svg('polyline', { points: points.join(' ') }));
      points = [];
    };
    values.forEach((v, i) => {
      if (v === null || v === undefined) { flush(); return; }
      points.push(((start + i) * step).toFixed(1) + ',' + (h - (v / max) * h).toFixed(1));
    });
    flush();
    const last = known.length ? fmt(known[known.length - 1]) : '–';
    return el('div', { class: 'chart', 'data-points': known.length }, [
      el('div', { class: 'title' }, [el('span', { text: title }), el('span', { text: 'now ' + last + ' · max ' + fmt(fixedMax || Math.max(0, ...known)) })]),
      s,
    ]);
  }

  function renderHistory() {
    document.getElementById('charts').replaceChildren(
      chart('chart-rps', 'requests/s', 'requests_per_second', rate),
      chart('chart-errors', 'errors/s', 'errors_per_second', rate),
      chart('chart-p99', 'p99 response time', 'p99_ms', (v) => v + ' ms'),
      chart('chart-ktls', 'kTLS share of new connections', 'ktls_share', pct, 1),
      chart('chart-cache', 'cache hit ratio', 'cache_hit_ratio', pct, 1),
    );
  }

  function render(doc) {
    document.getElementById('meta').textContent =
      'version ' + doc.version + ' · pid ' + doc.pid + ' · up ' + Math.floor(doc.uptime_seconds) + ' s';
    document.getElementById('updated').textContent = 'updated ' + when(doc.time);
    renderNow(doc);
    renderUpstreams(doc);
    renderCache(doc);
    renderSites(doc);
    renderHistory();
  }

  async function refresh() {
    try {
      const since = samples.length ? samples[samples.length - 1].t : 0;
      const r = await fetch('/status.json?since=' + since, { cache: 'no-store' });
      if (!r.ok) throw new Error('/status.json: ' + r.status);
      const doc = await r.json();
      samples = samples.concat(doc.history.samples).slice(-HISTORY);
      render(doc);
      refreshes += 1;
      document.body.setAttribute('data-refreshes', String(refreshes));
      document.getElementById('error').textContent = '';
    } catch (e) {
      document.getElementById('error').textContent = 'cannot refresh: ' + e;
    } finally {
      setTimeout(refresh, 1000);
    }
  }
  refresh();
})();
