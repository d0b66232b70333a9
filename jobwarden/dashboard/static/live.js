// The jobs table kept live: /live.json once a second, answered from the dashboard's one
// shared poll of wardend, whatever the number of open pages. Every value is written as text.
"use strict";
(function () {
  const table = document.getElementById("jobs");
  if (!table) { return; }
  const chosen = table.dataset.state;
  const live = document.getElementById("live");
  const address = "/live.json" + (chosen ? "?state=" + encodeURIComponent(chosen) : "");
  const cells = ["state", "attempt", "step", "last", "restarts", "lost", "incidents"];
  const text = function (id, value) {
    const node = document.getElementById(id);
    if (node) { node.textContent = String(value); }
  };
  const row = function (job) {
    const tr = document.createElement("tr");
    tr.dataset.job = job.id;
    const first = document.createElement("td");
    const link = document.createElement("a");
    link.href = "/job/" + encodeURIComponent(job.id);
    link.textContent = job.id;
    first.appendChild(link);
    tr.appendChild(first);
    for (const name of cells) {
      const td = document.createElement("td");
      td.textContent = String(job[name]);
      if (name === "state") { td.className = "state state-" + job.state; }
      tr.appendChild(td);
    }
    return tr;
  };
  const show = function (data) {
    const body = document.createElement("tbody");
    for (const job of data.rows) { body.appendChild(row(job)); }
    table.replaceChild(body, table.tBodies[0]);
    const none = document.getElementById("no-jobs");
    if (none) { none.hidden = data.rows.length > 0; }
    text("uptime", data.health.uptime);
    text("jobs-count", data.health.jobs);
    text("backlog", data.health.backlog);
    text("attention", data.health.needs_attention);
    text("rejected", data.health.rejected);
    live.textContent = "live";
    live.className = "live";
  };
  const poll = function () {
    fetch(address, { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) {
        if (!answer.ok) { throw new Error("answered " + answer.status); }
        return answer.json();
      })
      .then(show)
      .catch(function (error) {
        live.textContent = "not live: " + error.message;
        live.className = "live down";
      })
      .finally(function () { setTimeout(poll, 1000); });
  };
  setTimeout(poll, 1000);
})();
