// The dashboard: draws frames (see infer/dashboard/frame.py) of one engine, live from its
// SSE stream, or of several simulated strategies side by side, replayed on one clock.
"use strict";

const FREE = 0, EVICTABLE = 1, PRIVATE = 2, SHARED = 3;
const NO_OWNER = 0xffff;
const KIND_NAMES = ["free", "evictable", "private", "shared"];
const MAX_LIVE_FRAMES = 1500; // five minutes at five frames a second
const CHART_STEPS = 120; // bars in the step chart
const MAX_EVENTS = 60;
const MAX_ROWS = 200;
const css = getComputedStyle(document.documentElement);
const color = (name) => css.getPropertyValue(`--${name}`).trim();

// --- frames -----------------------------------------------------------------------------
async function inflate(b64) {
  const packed = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// Inflates a frame's block arrays once; the frame keeps them.
async function unpack(frame) {
  if (!frame.blocks) {
    const [kind, refs, owner, shareBlock, shareHolder] = await Promise.all(
      [frame.kind, frame.refs, frame.owner, frame.shareBlock, frame.shareHolder].map(inflate));
    frame.blocks = {
      kind, refs,
      owner: new Uint16Array(owner.buffer),
      shareBlock: new Uint32Array(shareBlock.buffer),
      shareHolder: new Uint16Array(shareHolder.buffer),
    };
  }
  return frame;
}

function hue(text) {
  let h = 0;
  for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) >>> 0;
  return (h * 137.508) % 360;
}

const requestColor = (id) => `hsl(${hue(id).toFixed(0)} 62% 58%)`;

// --- a panel: one engine, or one simulated strategy ----------------------------------------
class Panel {
  constructor(name, parent) {
    this.name = name;
    this.frames = [];
    this.selected = null; // a request id
    this.shown = null; // the frame drawn
    const el = document.createElement("section");
    el.className = "panel";
    el.dataset.name = name;
    el.innerHTML = `
      <div class="map"><h2></h2><div class="stats"></div><canvas class="pool"></canvas></div>
      <div class="side"><div class="events"><h3>Preemptions and evictions</h3><ol></ol></div></div>
      <div class="charts wide"></div>
      <div class="requests wide"><h3>Requests</h3><table><thead><tr><th>request</th>
        <th>state</th><th>prefill</th><th>decoded</th><th>blocks</th><th>preempted</th>
        </tr></thead><tbody></tbody></table></div>`;
    el.querySelector("h2").textContent = name;
    parent.appendChild(el);
    this.el = el;
    this.pool = el.querySelector("canvas.pool");
    this.stats = el.querySelector(".stats");
    this.events = el.querySelector(".events ol");
    this.tbody = el.querySelector("tbody");
    this.charts = {
      memory: addChart(el, "KV pool", [["utilisation %", "decode"], ["fragmentation %", "line"]]),
      throughput: addChart(el, "Throughput (tokens/s)",
        [["prefill", "prefill"], ["decode", "decode"]]),
      latency: addChart(el, "Latency of finished requests (ms)",
        [["TTFT", "prefill"], ["ITL", "decode"]]),
      steps: addChart(el, "Steps: tokens (bars), time (line)",
        [["prefill", "prefill"], ["decode", "decode"], ["graph", "graph"], ["eager", "eager"],
          ["step ms", "line"]]),
    };
    this.tbody.addEventListener("click", (e) => {
      const row = e.target.closest("tr");
      if (row) this.select(row.dataset.id);
    });
    this.pool.addEventListener("click", (e) => {
      const hit = this.blockAt(e);
      if (hit && hit.owner !== null) this.select(hit.owner);
    });
    this.pool.addEventListener("mousemove", (e) => this.hover(e));
    this.pool.addEventListener("mouseleave", () => { tooltip.hidden = true; });
  }

  select(id) {
    this.selected = this.selected === id ? null : id;
    if (this.shown) this.draw(this.shown, this.frames.indexOf(this.shown));
  }

  // The frame at or before time t (the last one when t is null), drawn with its history;
  // a later call that finishes inflating first wins, an earlier one then draws nothing.
  async show(t) {
    let i = this.frames.length - 1;
    if (t !== null) while (i > 0 && this.frames[i].t > t) i--;
    if (i < 0) return;
    const call = (this.calls = (this.calls || 0) + 1);
    const frame = await unpack(this.frames[i]);
    if (call === this.calls) this.draw(frame, i);
  }

  draw(frame, index) {
    this.shown = frame;
    this.drawPool(frame);
    this.drawStats(frame);
    this.drawRequests(frame);
    const history = this.frames.slice(0, index + 1);
    this.drawCharts(history);
    this.drawEvents(history);
  }

  // One cell a block, in rows; sizes the cells to fit the panel's width.
  drawPool(frame) {
    const { kind, refs, owner } = frame.blocks;
    const n = frame.numBlocks;
    const width = Math.max(this.pool.clientWidth, 100);
    const maxHeight = document.body.classList.contains("live") ? 420 : 300;
    const cell = Math.max(2, Math.min(18, Math.floor(Math.sqrt((width * maxHeight) / n))));
    const cols = Math.max(1, Math.floor(width / cell));
    const rows = Math.ceil(n / cols);
    const ratio = window.devicePixelRatio || 1;
    this.pool.width = cols * cell * ratio;
    this.pool.height = rows * cell * ratio;
    this.pool.style.height = `${rows * cell}px`;
    this.pool.style.width = `${cols * cell}px`;
    this.layout = { cell, cols };
    const ctx = this.pool.getContext("2d");
    ctx.scale(ratio, ratio);
    const gap = cell >= 5 ? 1 : 0;
    const ids = frame.requests.map((r) => r[0]);
    const colors = ids.map(requestColor);
    const mine = this.highlighted(frame);
    const counts = [0, 0, 0, 0];
    let maxRefs = 0;
    for (let b = 0; b < n; b++) {
      const k = kind[b];
      counts[k]++;
      if (k === SHARED && refs[b] > maxRefs) maxRefs = refs[b];
      let fill = color(KIND_NAMES[k]);
      if (k === PRIVATE) fill = owner[b] === NO_OWNER ? "#889" : colors[owner[b]];
      ctx.globalAlpha = mine && !mine.has(b) ? 0.25 : 1;
      ctx.fillStyle = fill;
      const x = (b % cols) * cell, y = Math.floor(b / cols) * cell;
      ctx.fillRect(x, y, cell - gap, cell - gap);
      if (k === SHARED && cell >= 12) {
        ctx.fillStyle = "#fff";
        ctx.font = `${Math.floor(cell * 0.6)}px system-ui`;
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.fillText(String(refs[b]), x + (cell - gap) / 2, y + (cell - gap) / 2 + 1);
      }
    }
    ctx.globalAlpha = 1;
    if (mine) {
      ctx.strokeStyle = "#111";
      ctx.lineWidth = 1.5;
      for (const b of mine) {
        ctx.strokeRect((b % cols) * cell + 0.75, Math.floor(b / cols) * cell + 0.75,
          cell - gap - 1.5, cell - gap - 1.5);
      }
    }
    // What was drawn, for tests and for anyone reading the DOM.
    const data = this.pool.dataset;
    data.blocks = n;
    data.free = counts[FREE];
    data.evictable = counts[EVICTABLE];
    data.private = counts[PRIVATE];
    data.shared = counts[SHARED];
    data.maxRefs = maxRefs;
    data.highlighted = mine ? mine.size : 0;
    data.t = frame.t;
  }

  // The blocks of the selected request (its own and the shared ones it holds), or null.
  highlighted(frame) {
    if (this.selected === null) return null;
    const index = frame.requests.findIndex((r) => r[0] === this.selected);
    const mine = new Set();
    if (index < 0) return mine;
    const { owner, shareBlock, shareHolder } = frame.blocks;
    for (let b = 0; b < owner.length; b++) if (owner[b] === index) mine.add(b);
    for (let i = 0; i < shareBlock.length; i++) {
      if (shareHolder[i] === index) mine.add(shareBlock[i]);
    }
    return mine;
  }

  blockAt(e) {
    if (!this.layout || !this.shown) return null;
    const rect = this.pool.getBoundingClientRect();
    const { cell, cols } = this.layout;
    const col = Math.floor((e.clientX - rect.left) / cell);
    const b = Math.floor((e.clientY - rect.top) / cell) * cols + col;
    if (col >= cols || b < 0 || b >= this.shown.numBlocks) return null;
    const { kind, refs, owner } = this.shown.blocks;
    const holder = owner[b] === NO_OWNER ? null : this.shown.requests[owner[b]][0];
    return { block: b, kind: KIND_NAMES[kind[b]], refs: refs[b], owner: holder };
  }

  hover(e) {
    const hit = this.blockAt(e);
    if (!hit) { tooltip.hidden = true; return; }
    let text = `block ${hit.block}: ${hit.kind}`;
    if (hit.kind === "shared") text += `, ${hit.refs} references`;
    if (hit.owner !== null) text += ` · ${hit.owner}`;
    tooltip.textContent = text;
    tooltip.style.left = `${e.clientX + 12}px`;
    tooltip.style.top = `${e.clientY + 12}px`;
    tooltip.hidden = false;
  }

  drawStats(frame) {
    const running = frame.requests.filter((r) => r[1] !== "waiting").length;
    const pct = (x) => `${(100 * x).toFixed(1)} %`;
    const items = [
      ["backend", frame.backend],
      ["blocks", `${frame.numBlocks} × ${frame.blockSize} tokens`],
      ["used", `${frame.used} (${pct(frame.used / frame.numBlocks)})`],
      ["shared", frame.shared],
      ["evictable", frame.evictable],
      ["fragmentation", pct(frame.fragmentation)],
      ["running", running],
      ["waiting", frame.waiting],
      ["t", `${frame.t.toFixed(2)} s`],
    ];
    this.stats.replaceChildren(...items.map(([k, v]) => {
      const span = document.createElement("span");
      span.append(`${k} `);
      const b = document.createElement("b");
      b.textContent = v;
      span.append(b);
      return span;
    }));
  }

  drawRequests(frame) {
    const rows = frame.requests.slice(0, MAX_ROWS).map((r) => {
      const [id, state, prompt, cached, computed, output, blocks, preemptions, maxTokens] = r;
      const tr = document.createElement("tr");
      tr.dataset.id = id;
      if (id === this.selected) tr.className = "selected";
      const prefilled = Math.min(computed, prompt);
      // Chunks of what the prefix cache did not hold (a guess after a preemption).
      const size = frame.chunkSize || Math.max(1, prompt - cached);
      const chunks = Math.ceil((prompt - cached) / size);
      const done = Math.ceil(Math.max(0, prefilled - cached) / size);
      const decoded = maxTokens ? `${output}/${maxTokens}` : String(output);
      tr.innerHTML = `<td class="id"><span class="dot"></span></td><td></td>
        <td><span class="bar"><i></i></span></td><td></td><td></td><td></td>`;
      const cells = tr.children;
      cells[0].querySelector(".dot").style.background = requestColor(id);
      cells[0].append(id);
      cells[0].title = id;
      cells[1].textContent = state;
      cells[1].className = `state-${state}`;
      const bar = cells[2].querySelector("i");
      bar.style.width = `${prompt ? (100 * prefilled) / prompt : 0}%`;
      bar.style.background = color("prefill");
      const hit = cached ? ` (${cached} cached)` : "";
      cells[2].append(`${prefilled}/${prompt}${hit} · chunk ${done}/${chunks}`);
      cells[3].textContent = decoded;
      cells[4].textContent = blocks;
      cells[5].textContent = preemptions || "";
      return tr;
    });
    this.tbody.replaceChildren(...rows);
    const more = frame.waiting - frame.requests.filter((r) => r[1] === "waiting").length;
    if (more > 0) {
      const tr = document.createElement("tr");
      tr.innerHTML = `<td colspan="6" class="state-waiting">… ${more} more waiting</td>`;
      this.tbody.append(tr);
    }
  }

  drawCharts(history) {
    const t0 = history.length ? history[0].t : 0;
    const t1 = history.length ? history[history.length - 1].t : 1;
    const memory = [[], []], throughput = [[], []], latency = [[], []];
    let steps = [];
    for (let i = 0; i < history.length; i++) {
      const f = history[i];
      memory[0].push([f.t, (100 * f.used) / f.numBlocks]);
      memory[1].push([f.t, 100 * f.fragmentation]);
      if (i > 0) {
        const dt = f.t - history[i - 1].t;
        let prefill = 0, decode = 0;
        for (const s of f.steps) { prefill += s[2]; decode += s[3]; }
        if (dt > 0) {
          throughput[0].push([f.t, prefill / dt]);
          throughput[1].push([f.t, decode / dt]);
        }
      }
      for (const [t, ttft, itl] of f.latencies) {
        latency[0].push([t, 1000 * ttft]);
        if (itl !== null) latency[1].push([t, 1000 * itl]);
      }
      if (f.steps.length) steps = steps.concat(f.steps).slice(-CHART_STEPS);
    }
    const span = [t0, Math.max(t1, t0 + 1e-9)];
    lineChart(this.charts.memory, span, [
      { points: memory[0], color: color("decode") },
      { points: memory[1], color: color("line") },
    ], 100);
    lineChart(this.charts.throughput, span, [
      { points: throughput[0], color: color("prefill") },
      { points: throughput[1], color: color("decode") },
    ]);
    lineChart(this.charts.latency, span, [
      { points: latency[0], color: color("prefill"), dots: true },
      { points: latency[1], color: color("decode"), dots: true },
    ]);
    stepChart(this.charts.steps, steps);
  }

  drawEvents(history) {
    const events = [];
    for (let i = 0; i < history.length; i++) {
      const f = history[i];
      for (const [t, id] of f.preempted) events.push([t, `${id} preempted (recomputed later)`]);
      const evicted = i > 0 ? f.evictions - history[i - 1].evictions : 0;
      if (evicted > 0) events.push([f.t, `${evicted} cached block${evicted > 1 ? "s" : ""} evicted`]);
    }
    const items = events.slice(-MAX_EVENTS).reverse().map(([t, text]) => {
      const li = document.createElement("li");
      li.textContent = `${t.toFixed(2)} s · ${text}`;
      return li;
    });
    if (!items.length) {
      const li = document.createElement("li");
      li.textContent = "none yet";
      li.className = "state-waiting";
      items.push(li);
    }
    this.events.replaceChildren(...items);
  }
}

// --- charts --------------------------------------------------------------------------------
const tooltip = document.getElementById("tooltip");

function addChart(panel, title, keys) {
  const box = document.createElement("div");
  box.className = "chart";
  const h = document.createElement("h3");
  h.textContent = title;
  const legend = document.createElement("div");
  legend.className = "keys";
  for (const [label, name] of keys) {
    const key = document.createElement("span");
    key.className = "key";
    key.style.background = color(name);
    legend.append(key, label);
  }
  const canvas = document.createElement("canvas");
  box.append(h, legend, canvas);
  panel.querySelector(".charts").append(box);
  return canvas;
}

function sized(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * ratio;
  canvas.height = h * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "10px system-ui";
  ctx.fillStyle = "#889";
  return { ctx, w, h };
}

function nice(value) {
  if (value <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= value);
}

const short = (v) => (v >= 1000 ? `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k` : `${+v.toFixed(1)}`);

function lineChart(canvas, [x0, x1], series, yMax) {
  const { ctx, w, h } = sized(canvas);
  const top = 10, bottom = h - 14, left = 30, right = w - 4;
  const peak = Math.max(0, ...series.flatMap((s) => s.points.map((p) => p[1])));
  const ymax = yMax ?? nice(peak);
  ctx.fillText(short(ymax), 2, top + 4);
  ctx.fillText("0", 2, bottom);
  ctx.fillText(`${x0.toFixed(1)} s`, left, h - 2);
  ctx.textAlign = "right";
  ctx.fillText(`${x1.toFixed(1)} s`, right, h - 2);
  ctx.strokeStyle = "#dde";
  ctx.strokeRect(left, top, right - left, bottom - top);
  const x = (t) => left + ((t - x0) / (x1 - x0)) * (right - left);
  const y = (v) => bottom - (Math.min(v, ymax) / ymax) * (bottom - top);
  for (const s of series) {
    ctx.strokeStyle = ctx.fillStyle = s.color;
    if (s.dots) {
      for (const [t, v] of s.points) ctx.fillRect(x(t) - 1.5, y(v) - 1.5, 3, 3);
      continue;
    }
    ctx.beginPath();
    s.points.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.lineWidth = 1.5;
    ctx.stroke();
  }
}

function stepChart(canvas, steps) {
  const { ctx, w, h } = sized(canvas);
  const top = 10, bottom = h - 18, left = 30, right = w - 30;
  const tokens = nice(Math.max(1, ...steps.map((s) => s[2] + s[3])));
  const ms = nice(Math.max(0.001, ...steps.map((s) => s[1])));
  ctx.fillText(short(tokens), 2, top + 4);
  ctx.fillText("0", 2, bottom);
  ctx.textAlign = "right";
  ctx.fillText(`${short(ms)} ms`, w - 2, top + 4);
  ctx.fillText(`last ${steps.length} steps`, right, h - 2);
  ctx.strokeStyle = "#dde";
  ctx.strokeRect(left, top, right - left, bottom - top);
  const slot = (right - left) / CHART_STEPS;
  const scale = (bottom - top) / tokens;
  steps.forEach(([, , prefill, decode, , graphed], i) => {
    const x = left + i * slot;
    const bw = Math.max(1, slot - 1);
    ctx.fillStyle = color("decode");
    ctx.fillRect(x, bottom - decode * scale, bw, decode * scale);
    ctx.fillStyle = color("prefill");
    ctx.fillRect(x, bottom - (decode + prefill) * scale, bw, prefill * scale);
    if (graphed !== null) {
      ctx.fillStyle = color(graphed ? "graph" : "eager");
      ctx.fillRect(x, bottom + 2, bw, 3);
    }
  });
  ctx.strokeStyle = color("line");
  ctx.lineWidth = 1.2;
  ctx.beginPath();
  steps.forEach((s, i) => {
    const x = left + i * slot + slot / 2, y = bottom - (s[1] / ms) * (bottom - top);
    i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
  });
  ctx.stroke();
}

// --- sources -------------------------------------------------------------------------------
const status = document.getElementById("status");

function setStatus(text, error = false) {
  status.textContent = text;
  status.classList.toggle("error", error);
}

// Reads the server's SSE stream with fetch (EventSource cannot send a key), sending the
// page's ?api_key= as a bearer token; reconnects after a failure.
async function live(url) {
  document.body.classList.add("live");
  const panel = new Panel("engine", document.getElementById("panels"));
  const key = new URLSearchParams(location.search).get("api_key");
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  let drawing = false;
  for (;;) {
    try {
      const response = await fetch(url, { headers, cache: "no-store" });
      if (response.status === 401) {
        setStatus("the stream needs the server's API key: open /dashboard?api_key=…", true);
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      setStatus("live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = event.split("\n").filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).trim()).join("\n");
          if (!data) continue;
          panel.frames.push(await unpack(JSON.parse(data)));
          if (panel.frames.length > MAX_LIVE_FRAMES) panel.frames.shift();
          if (!drawing) {
            drawing = true;
            requestAnimationFrame(() => { drawing = false; panel.show(null); });
          }
          setStatus(`live · ${panel.frames.length} frames`);
        }
      }
      setStatus("the stream ended; reconnecting…", true);
    } catch (err) {
      setStatus(`disconnected (${err.message}); reconnecting…`, true);
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// Frames recorded by kvsim, every strategy on the same simulated clock.
function replay(recorded) {
  const panels = recorded.map(({ name, frames }) => {
    const panel = new Panel(name, document.getElementById("panels"));
    panel.frames = frames;
    return panel;
  });
  const end = Math.max(0, ...recorded.flatMap((r) => r.frames.map((f) => f.t)));
  const player = document.getElementById("player");
  const scrub = document.getElementById("scrub");
  const play = document.getElementById("play");
  const speed = document.getElementById("speed");
  const clock = document.getElementById("clock");
  player.hidden = false;
  setStatus(`replay of ${recorded.length} strategies, ${end.toFixed(1)} s simulated`);
  let now = end;
  let timer = null;
  const show = async (t) => {
    now = t;
    scrub.value = end ? Math.round((1000 * t) / end) : 1000;
    clock.textContent = `${t.toFixed(2)} / ${end.toFixed(2)} s`;
    await Promise.all(panels.map((p) => p.show(t)));
  };
  scrub.addEventListener("input", () => show((end * scrub.value) / 1000));
  play.addEventListener("click", () => {
    if (timer) { clearInterval(timer); timer = null; play.textContent = "Play"; return; }
    if (now >= end) now = 0;
    play.textContent = "Pause";
    let last = performance.now();
    // The whole replay lasts 20 s at 1×.
    timer = setInterval(() => {
      const wall = performance.now();
      const t = Math.min(end, now + ((wall - last) / 20000) * end * Number(speed.value));
      last = wall;
      show(t);
      if (t >= end) play.click();
    }, 100);
  });
  show(end);
}

const source = JSON.parse(document.getElementById("source").textContent);
if (source.live) live(source.live);
else replay(source.replay);
