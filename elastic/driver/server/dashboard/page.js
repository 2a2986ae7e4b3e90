// The job's page: polls /ui/api/status every second and draws it; the buttons call the page's
// routes. Every request carries the session's page secret in X-Elasticrun-Page: the login
// handed it to this origin's local storage (enter.js); the session cookie alone, which the
// browser also sends to other services on this host, is refused. Every value from the job is
// written as text (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;
const SECRET_KEY = "elasticrun-page-secret";
const NEW_LOGIN =
  "open a new login link (`elasticrun status --login` prints one) or paste the job token";

function pageHeaders() {
  let secret = null;
  try {
    secret = window.localStorage.getItem(SECRET_KEY);
  } catch (error) {
    secret = null; // no storage: the driver answers 403, and the page says so
  }
  return secret ? { "X-Elasticrun-Page": secret } : {};
}

function $(id) {
  return document.getElementById(id);
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  return value < 10 ? `${value.toFixed(2)} s` : `${value.toFixed(0)} s`;
}

function rate(value) {
  return value === null || value === undefined ? "–" : value.toFixed(2);
}

function clock(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "–";
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}

function collective(c) {
  if (!c) return "–";
  const blocked = c.blocked_for === null ? "" : `, waiting ${seconds(c.blocked_for)}`;
  return `${c.kind} #${c.seq}${blocked}`;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (className) td.className = className;
  return td;
}

function fill(tableId, rows) {
  $(tableId).tBodies[0].replaceChildren(...rows);
}

function say(element, text, isError) {
  element.textContent = text;
  element.hidden = !text;
  element.classList.toggle("error", Boolean(isError));
}

async function act(method, url, question) {
  if (question && !window.confirm(question)) return;
  try {
    const headers = pageHeaders();
    const answer = await fetch(url, { method, headers, credentials: "same-origin" });
    const body = await answer.json().catch(() => ({}));
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    say($("answer"), answer.ok ? body.message : `${answer.status}: ${detail}`, !answer.ok);
  } catch (error) {
    say($("answer"), `the driver did not answer: ${error}`, true);
  }
  poll.soon();
}

function hostRow(host) {
  const tr = document.createElement("tr");
  tr.dataset.hostname = host.hostname;
  tr.dataset.state = host.state;
  tr.append(
    cell(host.hostname),
    cell(host.slots),
    cell(host.state, `state-${host.state}`),
    cell(host.until === null ? "–" : clock(host.until)),
  );
  const button = document.createElement("button");
  button.type = "button";
  const path = `/ui/api/hosts/${encodeURIComponent(host.hostname)}/drain`;
  if (host.state === "drained") {
    button.textContent = "Undrain";
    button.addEventListener("click", () => act("DELETE", path));
  } else {
    button.textContent = "Drain";
    button.addEventListener("click", () =>
      act("POST", path, `Drain ${host.hostname}? Its workers leave at their next step.`),
    );
  }
  const td = document.createElement("td");
  td.append(button);
  tr.append(td);
  return tr;
}

function workerRow(w) {
  const tr = document.createElement("tr");
  tr.dataset.workerId = w.worker_id;
  tr.dataset.state = w.state;
  if (w.rank !== null) tr.dataset.rank = w.rank;
  if (w.pid !== null) tr.dataset.pid = w.pid;
  tr.append(
    cell(w.rank, "rank"),
    cell(w.hostname),
    cell(w.worker_id),
    cell(w.pid),
    cell(endedAs(w), `state-${w.state}`),
    cell(w.steps),
    cell(rate(w.step_rate)),
    cell(w.commit),
    cell(seconds(w.commit_age)),
    cell(seconds(w.heartbeat_age)),
    cell(collective(w.collective)),
  );
  return tr;
}

function endedAs(w) {
  if (w.end_cause) return `${w.state} (${w.end_cause})`;
  return w.exit_code === null ? w.state : `${w.state} (${w.exit_code})`;
}

const LIVE_STATES = ["launching", "member", "leaving"];

// "214 workers ended: 212 signal SIGKILL, 2 stopped (the newest 32 listed)"
function endedLine(status) {
  const total = status.ended_total ?? 0;
  if (!total) return "";
  const causes = Object.entries(status.ended_by_cause ?? {}).sort(
    (a, b) => b[1] - a[1] || a[0].localeCompare(b[0]),
  );
  const listed = status.workers.filter((w) => !LIVE_STATES.includes(w.state)).length;
  const shown = listed < total ? ` (the newest ${listed} listed)` : "";
  return `${total} worker(s) ended: ${causes.map(([c, n]) => `${n} ${c}`).join(", ")}${shown}`;
}

function roundRow(r) {
  const tr = document.createElement("tr");
  tr.dataset.round = r.number;
  tr.dataset.cause = r.cause;
  tr.append(
    cell(r.number),
    cell(clock(r.formed_at)),
    cell(r.size),
    cell(r.cause, `cause cause-${r.cause}`),
    cell(seconds(r.noticed_to_formed)),
    cell(seconds(r.formed_to_first_step)),
    cell(r.reason),
  );
  return tr;
}

function decisionRow(d) {
  const tr = document.createElement("tr");
  tr.append(cell(clock(d.time)), cell(d.round), cell(d.reason));
  return tr;
}

function draw(status) {
  $("job-id").textContent = status.job_id;
  $("round").textContent = status.round;
  $("size").textContent = status.size;
  $("updated").textContent = new Date().toLocaleTimeString();
  fill("hosts", status.hosts.map(hostRow));
  const workers = [...status.workers].sort(
    (a, b) => (a.rank ?? Infinity) - (b.rank ?? Infinity) || a.worker_id.localeCompare(b.worker_id),
  );
  fill("workers", workers.map(workerRow));
  const ended = endedLine(status);
  $("ended").hidden = !ended;
  $("ended").textContent = ended;
  fill("rounds", [...status.rounds].reverse().map(roundRow));
  fill("decisions", [...status.decisions].reverse().map(decisionRow));
  $("stall").hidden = !status.stall;
  $("stall-line").textContent = status.stall ? status.stall.line : "";
  const log = $("log");
  const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.textContent = status.log_tail.join("\n");
  if (atEnd) log.scrollTop = log.scrollHeight;
}

const poll = {
  timer: null,
  async run() {
    clearTimeout(poll.timer);
    try {
      const answer = await fetch("/ui/api/status", {
        headers: pageHeaders(),
        credentials: "same-origin",
      });
      if (answer.status === 401 || answer.status === 403) {
        const why = answer.status === 401 ? "Logged out" : "This page lost its login's secret";
        say($("connection"), `${why}: reload the page and ${NEW_LOGIN}.`, true);
        return; // no more polling until the page is reloaded
      }
      if (!answer.ok) throw new Error(`${answer.status}`);
      draw(await answer.json());
      say($("connection"), "");
    } catch (error) {
      say($("connection"), `The driver does not answer (${error.message}): the job may have ended.`, true);
    }
    poll.timer = setTimeout(poll.run, POLL_MS);
  },
  soon() {
    clearTimeout(poll.timer);
    poll.timer = setTimeout(poll.run, 0);
  },
};

document.addEventListener("DOMContentLoaded", () => {
  $("stop").addEventListener("click", () =>
    act("POST", "/ui/api/stop", "Stop the job? Every worker is stopped and the launcher exits."),
  );
  $("logout").addEventListener("click", async () => {
    await act("POST", "/ui/api/logout");
    try {
      window.localStorage.removeItem(SECRET_KEY);
    } catch (error) {
      // nothing kept, nothing to forget
    }
    window.location.assign("/ui");
  });
  poll.run();
});
