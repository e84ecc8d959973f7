// The satellite's admin page: reads /api/analytics with the admin token the user pastes (kept in this tab's
// sessionStorage only) and shows the same figures the API returns. No framework, no CDN: charts are SVG the
// satellite draws.
"use strict";

const TOKEN_KEY = "satellite-admin-token";
const $ = (id) => document.getElementById(id);

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, params) {
  const query = new URLSearchParams(params || {});
  const response = await fetch(`/api/analytics/${path}?${query}`, {
    headers: { Authorization: `Bearer ${token()}` },
  });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.message) message = body.message;
    } catch (_) {
      // not JSON: keep the status line
    }
    throw new ApiError(response.status, message);
  }
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

function formatNumber(value) {
  if (value === null || value === undefined) return "–";
  return Math.round(value).toLocaleString("en-US");
}

function formatPercent(value) {
  if (value === null || value === undefined) return "–";
  return `${(value * 100).toFixed(1)}%`;
}

function figure(summary, path) {
  return path.split(".").reduce((node, key) => (node == null ? null : node[key]), summary);
}

function filters() {
  const params = { bucket: $("bucket").value };
  const days = Number($("range").value);
  if (days > 0) params.from = new Date(Date.now() - days * 86400000).toISOString();
  const user = $("user").value.trim();
  if (user) params.user_id = user;
  return params;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fillTable(id, items, columns) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren();
  if (items.length === 0) {
    const row = body.insertRow();
    const td = cell(row, "nothing yet", "muted");
    td.colSpan = columns.length;
    return;
  }
  for (const item of items) {
    const row = body.insertRow();
    for (const [value, className] of columns.map((column) => column(item))) {
      cell(row, value, className);
    }
  }
}

async function load() {
  $("load-error").textContent = "";
  const params = filters();
  const [summary, users, instances, failures, savings, servers] = await Promise.all([
    api("summary", params),
    api("users", { ...params, limit: 100 }),
    api("instances", { ...params, limit: 100 }),
    api("failures", { ...params, limit: 20 }),
    api("charts/savings.svg", params),
    api("charts/servers.svg", params),
  ]);
  for (const element of document.querySelectorAll("[data-figure]")) {
    const path = element.dataset.figure;
    const value = figure(summary, path);
    element.dataset.value = value === null || value === undefined ? "" : String(value);
    element.textContent = /ratio|rate/.test(path) ? formatPercent(value) : formatNumber(value);
  }
  $("scope").textContent = summary.filter.scope === "all_teams" ? "every team" : summary.filter.scope.replace("team:", "team ");
  // The SVG is the satellite's own, drawn with every label escaped.
  $("chart-savings").innerHTML = savings;
  $("chart-servers").innerHTML = servers;
  fillTable("users", users.items, [
    (u) => [u.user_id],
    (u) => [u.team_id],
    (u) => [formatNumber(u.realized.sessions), "num"],
    (u) => [formatNumber(u.realized.proxy_tokens), "num"],
    (u) => [formatNumber(u.realized.received_tokens), "num"],
    (u) => [formatPercent(u.realized.saved_ratio), "num"],
    (u) => [formatNumber(u.calls.total), "num"],
    (u) => [formatPercent(u.calls.error_rate), "num"],
    (u) => [formatPercent(u.discovers.hit_rate), "num"],
  ]);
  $("status-counts").textContent = Object.entries(instances.by_status)
    .map(([status, count]) => `${count} ${status}`)
    .join(" · ") || "no instances";
  fillTable("instances", instances.items, [
    (i) => [i.server_slug],
    (i) => [i.user_id],
    (i) => [i.status, `status-${i.status}`],
    (i) => [new Date(i.since).toLocaleString()],
    (i) => [formatNumber(i.tools), "num"],
  ]);
  fillTable("failures", failures.items, [
    (f) => [new Date(f.at).toLocaleString()],
    (f) => [f.kind],
    (f) => [f.server_slug || "–"],
    (f) => [f.user_id],
    (f) => [f.detail],
  ]);
  document.body.dataset.loaded = String(Date.now());
}

function show(signedIn) {
  $("sign-in").hidden = signedIn;
  $("dashboard").hidden = !signedIn;
  $("sign-out").hidden = !signedIn;
}

async function refresh() {
  try {
    await load();
  } catch (error) {
    if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
      sessionStorage.removeItem(TOKEN_KEY);
      show(false);
      $("sign-in-error").textContent = error.message;
      return;
    }
    $("load-error").textContent = `Could not load the figures: ${error.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("sign-in-error").textContent = "";
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    show(true);
    await refresh();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    show(false);
  });
  for (const id of ["range", "bucket"]) $(id).addEventListener("change", refresh);
  $("user").addEventListener("change", refresh);
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    refresh();
  });
  if (token()) {
    show(true);
    refresh();
  } else {
    show(false);
  }
});
