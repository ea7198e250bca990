// pyinfer's web page: the chat (streamed over /v1/chat/completions) and the live view
// (polling /live.json). Plain script, no build step, nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);

// ---- the API, with the key the user typed (kept for this tab only)

function apiKey() {
  return $("api-key").value.trim();
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// An error response's message, as the server shapes it ({"error": {"message", "code"...}}).
async function errorText(resp) {
  let msg = resp.statusText || "request failed";
  let code = null;
  try {
    const body = await resp.json();
    if (body && body.error) {
      msg = body.error.message || msg;
      code = body.error.code || body.error.type || null;
    }
  } catch (e) {
    // not JSON: the status line is all there is
  }
  let text = "Error " + resp.status + (code ? " (" + code + ")" : "") + ": " + msg;
  if (resp.status === 503) {
    const after = resp.headers.get("Retry-After");
    text += after ? " The server is busy: try again in " + after + " s." : " The server is busy: try again soon.";
  } else if (resp.status === 401) {
    text += " Enter the server's API key under Settings.";
  }
  return text;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(ms >= 100 ? 0 : 1) + " ms";
}

function fmtBytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) {
    b /= 1024;
    i++;
  }
  return (i ? b.toFixed(b >= 100 ? 0 : 1) : b.toFixed(0)) + " " + units[i];
}

// ---- the model's name and context size

let nCtx = null;

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) {
      $("model-name").textContent = "model: unknown";
      if (resp.status === 401) {
        $("settings").open = true;
        showError(await errorText(resp));
      }
      return;
    }
    const m = (await resp.json()).data[0];
    $("model-name").textContent = "model: " + m.id;
    if (m.meta && m.meta.n_ctx) {
      nCtx = m.meta.n_ctx;
      $("model-ctx").textContent = "· context " + nCtx + " tokens";
      $("max_tokens").max = String(nCtx);
    }
  } catch (e) {
    $("model-name").textContent = "model: the server does not answer";
  }
}

// ---- tabs (WAI-ARIA tabs: arrow keys move between them, Tab moves into the panel)

const tabs = () => Array.from(document.querySelectorAll('[role="tab"]'));

function selectTab(tab, focus) {
  for (const t of tabs()) {
    const on = t === tab;
    t.setAttribute("aria-selected", on ? "true" : "false");
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  if (focus) tab.focus();
  if (tab.id === "tab-live") startLive();
  else stopLive();
}

function setupTabs() {
  for (const t of tabs()) {
    t.addEventListener("click", () => selectTab(t, false));
    t.addEventListener("keydown", (ev) => {
      const all = tabs();
      const i = all.indexOf(t);
      let j = null;
      if (ev.key === "ArrowRight") j = (i + 1) % all.length;
      else if (ev.key === "ArrowLeft") j = (i - 1 + all.length) % all.length;
      else if (ev.key === "Home") j = 0;
      else if (ev.key === "End") j = all.length - 1;
      if (j !== null) {
        ev.preventDefault();
        selectTab(all[j], true);
      }
    });
  }
}

// ---- chat

const conversation = []; // {role, content} turns sent with each request
let current = null; // the answer being streamed: {controller, el, ...}

function announce(text) {
  $("chat-status").textContent = text;
}

function addMessage(role, text) {
  const hint = $("chat-hint");
  if (hint) hint.remove();
  const el = document.createElement("article");
  el.className = "msg " + role;
  const who = document.createElement("h3");
  who.className = "who";
  who.textContent = role === "user" ? "You" : role === "assistant" ? "Assistant" : "Error";
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  el.append(who, body);
  $("messages").append(el);
  scrollToEnd();
  return el;
}

function scrollToEnd() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function showError(text) {
  const el = addMessage("error", text);
  el.setAttribute("role", "alert");
  announce(text);
  return el;
}

function numberField(id, name, integer) {
  const raw = $(id).value.trim();
  if (raw === "") return null;
  const v = Number(raw);
  if (!Number.isFinite(v) || (integer && !Number.isInteger(v))) {
    throw new Error(name + " must be " + (integer ? "a whole number" : "a number") + ", not '" + raw + "'");
  }
  return v;
}

function requestBody() {
  const body = {
    model: "default",
    messages: [],
    stream: true,
    stream_options: { include_usage: true },
  };
  const system = $("system").value.trim();
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...conversation);
  const fields = [["temperature", "temperature", false], ["top_p", "top_p", false],
    ["max_tokens", "max_tokens", true], ["seed", "seed", true]];
  for (const [id, name, integer] of fields) {
    const v = numberField(id, name, integer);
    if (v !== null) body[name] = v;
  }
  return body;
}

function setBusy(busy) {
  const hadStop = document.activeElement === $("stop");
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  if (hadStop && !busy) $("prompt").focus(); // a disabled button drops the focus: keep it on the page
  $("messages").setAttribute("aria-busy", busy ? "true" : "false");
}

// The line under an answer: its size and speed, from the response's timings.
function statsLine(a) {
  const t = a.timings;
  const parts = [];
  if (t) {
    parts.push(t.predicted_n + " tokens");
    if (t.predicted_per_second) parts.push(t.predicted_per_second.toFixed(1) + " tokens/s");
    if (t.ttft_ms !== null && t.ttft_ms !== undefined) parts.push("TTFT " + fmtMs(t.ttft_ms));
    parts.push("prompt " + (t.prompt_n + t.cache_n) + " tokens" + (t.cache_n ? " (" + t.cache_n + " cached)" : ""));
  } else if (a.chunks) {
    parts.push(a.chunks + (a.chunks === 1 ? " chunk" : " chunks") + " received");
    if (a.firstAt) parts.push("first after " + fmtMs(a.firstAt - a.sentAt) + " (measured here)");
  }
  if (a.finish === "length") parts.push("stopped at max_tokens");
  if (a.stopped) parts.push("stopped by you");
  return parts.join(" · ");
}

function finishAnswer(a) {
  const stats = document.createElement("p");
  stats.className = "stats";
  stats.textContent = statsLine(a);
  a.el.append(stats);
  a.el.classList.remove("streaming");
  scrollToEnd();
  if (a.text) conversation.push({ role: "assistant", content: a.text });
  announce(a.stopped ? "Answer stopped. " + stats.textContent : "Answer finished. " + stats.textContent);
}

async function send(text) {
  if (current) return;
  let body;
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  try {
    body = requestBody();
  } catch (e) {
    conversation.pop();
    showError(e.message);
    return;
  }
  const controller = new AbortController();
  const a = {
    controller, el: null, textEl: null, text: "", chunks: 0, timings: null, finish: null,
    stopped: false, sentAt: performance.now(), firstAt: null,
  };
  current = a;
  setBusy(true);
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!resp.ok) {
      conversation.pop(); // the turn did not happen
      showError(await errorText(resp));
      return;
    }
    a.el = addMessage("assistant", "");
    a.el.classList.add("streaming");
    a.textEl = a.el.querySelector(".text");
    await readStream(resp, a);
    if (!a.timings && !a.stopped && !a.failed) {
      showError("The answer ended before the server finished it (the connection closed).");
    }
    finishAnswer(a);
  } catch (e) {
    if (e.name === "AbortError") {
      a.stopped = true;
      if (a.el) finishAnswer(a);
      else {
        conversation.pop();
        announce("Stopped before the answer began.");
      }
    } else {
      if (!a.el) conversation.pop();
      showError("Error: the request failed (" + e.message + "). Is the server still running?");
      if (a.el) finishAnswer(a);
    }
  } finally {
    current = null;
    setBusy(false);
  }
}

// Server-sent events: "data: {json}" blocks separated by a blank line, then "data: [DONE]".
async function readStream(resp, a) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data), a);
      }
    }
  }
}

function onEvent(ev, a) {
  if (ev.error) {
    a.failed = true;
    showError("Error from the server: " + (ev.error.message || "unknown"));
    return;
  }
  if (ev.timings) a.timings = ev.timings;
  const choice = ev.choices && ev.choices[0];
  if (!choice) return;
  const piece = choice.delta && choice.delta.content;
  if (piece) {
    if (a.firstAt === null) a.firstAt = performance.now();
    a.text += piece;
    a.chunks++;
    a.textEl.textContent = a.text;
    scrollToEnd();
  }
  if (choice.finish_reason) a.finish = choice.finish_reason;
}

function stop() {
  if (current) current.controller.abort();
}

function setupChat() {
  const prompt = $("prompt");
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = prompt.value.trim();
    if (!text || current) return;
    prompt.value = "";
    send(text);
  });
  prompt.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && current) {
      ev.preventDefault();
      stop();
    }
  });
  $("clear").addEventListener("click", () => {
    stop();
    conversation.length = 0;
    $("messages").replaceChildren();
    announce("New chat.");
    prompt.focus();
  });
  const key = $("api-key");
  key.value = sessionStorage.getItem("pyinfer-api-key") || "";
  key.addEventListener("change", () => {
    sessionStorage.setItem("pyinfer-api-key", key.value.trim());
    loadModel();
  });
}

// ---- live view

const SEGMENTS = [
  ["tokenize", "tokenize"], ["queue", "queue"], ["prefill", "prefill"],
  ["first_sample", "first sampling"], ["decode", "decode"],
];
let liveTimer = null;
let liveSince = 0;
let samples = []; // the engine's gauges, oldest first (not window.history)
let keepSamples = 600;

function startLive() {
  if (liveTimer === null) {
    pollLive();
    liveTimer = setInterval(pollLive, 500);
  }
}

function stopLive() {
  if (liveTimer !== null) {
    clearInterval(liveTimer);
    liveTimer = null;
  }
}

let polling = false;

async function pollLive() {
  if (polling) return;
  polling = true;
  const err = $("live-error");
  try {
    const resp = await fetch("/live.json?since=" + liveSince, { headers: headers() });
    if (!resp.ok) {
      err.textContent = await errorText(resp);
      err.hidden = false;
      return;
    }
    err.hidden = true;
    drawLive(await resp.json());
  } catch (e) {
    err.textContent = "The live view cannot reach the server (" + e.message + ").";
    err.hidden = false;
  } finally {
    polling = false;
  }
}

function drawLive(s) {
  // Sample times are seconds before this answer; kept as times on this page's clock.
  const now = performance.now() / 1000;
  for (const h of s.history) {
    samples.push(Object.assign({}, h, { at: now + h.t }));
    liveSince = Math.max(liveSince, h.n);
  }
  keepSamples = Math.round(300 / s.interval_s); // five minutes
  if (samples.length > keepSamples) samples = samples.slice(samples.length - keepSamples);
  const n = s.now;
  const last = samples.length ? samples[samples.length - 1] : null;
  $("value-batch").textContent = n.running + " / " + s.max_batch + " sequences · last step " + n.batch_size + " rows";
  $("value-tps").textContent = (last ? last.tokens_per_s : 0).toFixed(1) + " tokens/s";
  $("value-kv").textContent = fmtBytes(n.kv_in_use) + " / " + fmtBytes(n.kv_budget) +
    " (" + (100 * n.kv_in_use / n.kv_budget).toFixed(1) + "%) · " + fmtBytes(n.kv_idle) + " idle cache";
  $("value-queue").textContent = n.waiting + " waiting";
  const span = samples.length > 1 ? samples[samples.length - 1].at - samples[0].at : 0;
  $("live-window").textContent = "Charts: the last " + Math.max(1, Math.round(span)) +
    " s, sampled every " + s.interval_s + " s; " + n.requests_finished + " requests finished so far.";
  const count = (v) => v.toFixed(0);
  spark("card-batch", samples.map((h) => h.running), s.max_batch, count);
  spark("card-tps", samples.map((h) => h.tokens_per_s), null, (v) => v.toFixed(1));
  spark("card-kv", samples.map((h) => h.kv_in_use), n.kv_budget, fmtBytes);
  spark("card-queue", samples.map((h) => h.waiting), null, count);
  drawRows(s.requests);
}

const SVG = "http://www.w3.org/2000/svg";

// A sparkline: the values over time, from 0 at the bottom to max (or their own maximum) at
// the top; the caption under it gives that scale and the highest value seen.
function spark(card, values, max, fmt) {
  const svg = document.querySelector("#" + card + " svg");
  const peak = Math.max(0, ...values);
  const top = Math.max(max || 0, peak, 1e-9);
  document.querySelector("#" + card + " .range").textContent = max
    ? "chart: 0 to " + fmt(max) + " · highest " + fmt(peak)
    : "chart: 0 to its highest, " + fmt(peak);
  const w = 300;
  const hgt = 60;
  const n = Math.max(values.length - 1, 1);
  const pts = values.map((v, i) => (i * w / n).toFixed(1) + "," + (hgt - 2 - (v / top) * (hgt - 4)).toFixed(1));
  let line = svg.querySelector("polyline");
  if (!line) {
    line = document.createElementNS(SVG, "polyline");
    svg.append(line);
  }
  line.setAttribute("points", pts.join(" "));
}

function drawRows(reqs) {
  const list = $("rows");
  const longest = Math.max(1, ...reqs.map((r) => r.e2e_ms));
  $("live-scale").textContent = reqs.length
    ? "Each bar starts when its request arrived; a full-width bar is " + fmtMs(longest) + "."
    : "No requests yet: send one from the chat.";
  const items = reqs.map((r) => row(r, longest));
  list.replaceChildren(...items);
}

function row(r, longest) {
  const li = document.createElement("li");
  li.className = "row state-" + r.state;
  li.dataset.requestId = r.id;
  li.dataset.state = r.state;
  li.dataset.e2eMs = String(r.e2e_ms);

  const label = document.createElement("div");
  label.className = "label";
  const id = document.createElement("span");
  id.className = "rid";
  id.textContent = r.id.replace(/^(chat)?cmpl-/, "").slice(0, 8);
  id.title = r.id;
  const what = document.createElement("span");
  what.className = "what";
  const state = r.state === "done" ? (r.finish_reason || "done") : r.state;
  const ago = -r.start_ms / 1000;
  what.textContent = state + " · " + fmtMs(r.e2e_ms) + " · prompt " + r.prompt_tokens +
    (r.cached_tokens ? " (" + r.cached_tokens + " cached)" : "") + " → " + r.predicted_n + " tokens · " +
    (ago < 60 ? ago.toFixed(0) + " s ago" : Math.round(ago / 60) + " min ago");
  label.append(id, what);

  const bar = document.createElement("div");
  bar.className = "bar";
  bar.style.width = Math.max(0.5, (100 * r.e2e_ms) / longest) + "%";
  const words = [];
  for (const [key, name] of SEGMENTS) {
    if (!(key in r.segments)) continue;
    const ms = r.segments[key];
    const seg = document.createElement("span");
    seg.className = "seg seg-" + key;
    seg.dataset.segment = key;
    seg.dataset.ms = String(ms);
    seg.style.width = (r.e2e_ms > 0 ? (100 * ms) / r.e2e_ms : 0) + "%";
    seg.title = name + " " + fmtMs(ms);
    if (key === "prefill" && r.cached_tokens) {
      // The share of the prompt found in the prefix cache (not evaluated), along the segment.
      const c = document.createElement("span");
      c.className = "cached";
      c.style.width = (100 * r.cached_tokens) / r.prompt_tokens + "%";
      c.title = r.cached_tokens + " of " + r.prompt_tokens + " prompt tokens from the prefix cache";
      seg.append(c);
      seg.title += " (" + r.cached_tokens + " of " + r.prompt_tokens + " prompt tokens cached)";
    }
    bar.append(seg);
    words.push(name + " " + fmtMs(ms));
  }
  bar.setAttribute("role", "img");
  bar.setAttribute("aria-label", "Request " + id.textContent + ": " + words.join(", "));
  li.append(label, bar);
  return li;
}

// ---- start

document.addEventListener("DOMContentLoaded", () => {
  setupTabs();
  setupChat();
  loadModel();
  $("prompt").focus();
});
