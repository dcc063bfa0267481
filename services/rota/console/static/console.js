// The Rota console's one script: it refreshes what changes while a page is open.
// The plan grid redraws from /plan.json every 2 s; a job's page reloads when its state
// changes (polling /jobs/ID.json); the tenants page samples F every 5 s into sparklines.
"use strict";

async function getJSON(url) {
  const reply = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!reply.ok) throw new Error(url + ": " + reply.status);
  return reply.json();
}

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function drawPlan(plan) {
  const table = document.getElementById("plan-grid");
  const meta = document.getElementById("plan-meta");
  const legend = document.getElementById("plan-legend");
  if (!plan) { meta.textContent = "No plan yet: the allocator plans once a node has registered."; return; }
  const age = plan.created_at ? `${Math.max(0, Math.round((Date.now() - Date.parse(plan.created_at)) / 1000))}s ago` : "-";
  meta.textContent = `epoch ${plan.epoch}, ${plan.policy} after ${plan.trigger}, ${age}; ` +
    `${plan.rows.length} GPUs x ${plan.steps.length} steps of ${plan.step_seconds}s`;
  const head = el("tr");
  head.appendChild(el("th", "GPU"));
  for (const s of plan.steps) head.appendChild(el("th", String(s)));
  const body = document.createElement("tbody");
  for (const row of plan.rows) {
    const tr = el("tr");
    tr.appendChild(el("th", row.label));
    for (const c of row.cells) {
      const td = el("td", c.job, { colspan: String(c.span), title: c.job || "idle", class: c.job ? "cell" : "cell idle" });
      if (c.colour) td.style.background = c.colour;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  table.tHead.replaceChildren(head);
  table.tBodies[0].replaceWith(body);
  legend.replaceChildren(...plan.legend.map((l) => { const s = el("span", l.job); s.style.background = l.colour; return s; }));
}

function every(ms, fn) {
  const tick = async () => { try { await fn(); } catch (e) { console.warn(e); } setTimeout(tick, ms); };
  setTimeout(tick, ms);
}

function watchJob(section) {
  const id = section.dataset.jobId, shown = section.dataset.state;
  if (["SUCCEEDED", "FAILED", "CANCELLED"].includes(shown)) return;
  every(2000, async () => {
    const job = await getJSON(`/jobs/${encodeURIComponent(id)}.json`);
    if (job.state !== shown) { window.location.replace(`/jobs/${encodeURIComponent(id)}`); return; }
    document.getElementById("reason").textContent = job.reason;
    document.getElementById("progress").textContent =
      Object.entries(job.progress).map(([k, v]) => `${k}=${v}`).join(" ") || "-";
    const bar = document.getElementById("progress-bar");
    if (bar && job.progress.total > 0) bar.value = Math.min(1, job.progress.step / job.progress.total);
  });
}

function watchFairness(table) {
  const history = {};
  const draw = (tenant, sampled) => {
    const svg = table.querySelector(`tr[data-tenant="${CSS.escape(tenant)}"] svg.spark`);
    const values = sampled.filter((v) => v !== null);  // null: F n/a (no demand in the window)
    if (!svg || values.length === 0) return;
    const top = Math.max(1.5, ...values);
    const points = values.map((v, i) => `${(i * 120) / Math.max(1, values.length - 1)},${24 - (v / top) * 22}`).join(" ");
    const ns = "http://www.w3.org/2000/svg";
    const one = document.createElementNS(ns, "line");
    one.setAttribute("x1", "0"); one.setAttribute("x2", "120");
    one.setAttribute("y1", String(24 - 22 / top)); one.setAttribute("y2", String(24 - 22 / top));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points);
    svg.replaceChildren(one, line);
  };
  const sample = async () => {
    const standings = await getJSON(table.dataset.refresh);
    for (const t of standings.tenants) {
      (history[t.tenant] = history[t.tenant] || []).push(t.fairness);
      if (history[t.tenant].length > 60) history[t.tenant].shift();
      const cell = table.querySelector(`tr[data-tenant="${CSS.escape(t.tenant)}"] td.f`);
      if (cell) cell.textContent = t.fairness === null ? "n/a" : t.fairness.toFixed(2);
      draw(t.tenant, history[t.tenant]);
    }
  };
  sample().catch(console.warn);
  every(5000, sample);
}

document.addEventListener("DOMContentLoaded", () => {
  const grid = document.getElementById("plan-grid");
  if (grid) every(2000, async () => drawPlan((await getJSON(grid.dataset.refresh)).plan));
  const job = document.getElementById("job");
  if (job) watchJob(job);
  const standings = document.getElementById("standings");
  if (standings) watchFairness(standings);
});
