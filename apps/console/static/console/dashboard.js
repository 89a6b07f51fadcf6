// The fleet dashboard: drawn from the state the page carries (#fleet-state), then kept live by
// the messages of its WebSocket (apps/console/consumers.py): "fleet" (every node, the charts and
// the intents table, every few seconds) and "nodes" (the nodes whose heartbeats just came).
(() => {
  const root = document.getElementById("fleet-dashboard");
  const table = document.querySelector("#fleet-nodes tbody");
  const connection = document.getElementById("fleet-connection");
  const palette = ["#417690", "#e0a800", "#5b9a68", "#b35c44", "#8e6bb3", "#4db6ac", "#79aec8"];
  // Reconnect after a lost socket, waiting longer each time, up to this (ms).
  const MAX_RETRY_MS = 10000;

  const nodes = new Map(); // node id -> its latest row data
  let staleAfter = 6;
  let clockOffset = 0; // server seconds minus this browser's, from the last message

  const serverNow = () => Date.now() / 1000 + clockOffset;
  const percent = (fraction) => `${Math.round(fraction * 100)}%`;

  // One cell per column, each named by data-field so that a row is updated in place.
  const CELLS = {
    name: (n) => n.name,
    model: (n) => `${n.model} ${n.version}`,
    hardware: (n) => [n.profile || "no profile", n.gpus].filter(Boolean).join(" · "),
    status: (n) => status(n),
    memory: (n) => percent(n.memory_used),
    gpu_utilization: (n) => (n.gpu_count ? percent(n.gpu_utilization) : "-"),
    bandwidth_utilization: (n) => (n.gpu_count ? percent(n.bandwidth_utilization) : "-"),
    temperature: (n) => (n.gpu_count ? `${Math.round(n.temperature_c)} °C` : "-"),
    running: (n) => String(n.running),
    waiting: (n) => String(n.waiting),
    kv_cache: (n) => percent(n.kv_cache),
    heartbeat: (n) => age(n),
  };

  function status(node) {
    if (node.status === "up" && serverNow() - node.heartbeat_at > staleAfter) return "stale";
    return node.drained && node.status === "up" ? "drained" : node.status;
  }

  function age(node) {
    const seconds = Math.max(0, serverNow() - node.heartbeat_at);
    return seconds < 90 ? `${seconds.toFixed(1)} s ago` : `${Math.round(seconds / 60)} min ago`;
  }

  function row(node) {
    let tr = table.querySelector(`tr[data-node-id="${node.id}"]`);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.nodeId = node.id;
      for (const field of Object.keys(CELLS)) {
        const cell = document.createElement(field === "name" ? "th" : "td");
        cell.dataset.field = field;
        tr.append(cell);
      }
      table.append(tr);
    }
    return tr;
  }

  // The cells drawn as a bar as well: how full, how busy (0..1).
  const BARS = {
    memory: (n) => n.memory_used,
    gpu_utilization: (n) => (n.gpu_count ? n.gpu_utilization : 0),
    bandwidth_utilization: (n) => (n.gpu_count ? n.bandwidth_utilization : 0),
    kv_cache: (n) => n.kv_cache,
  };

  function draw(node) {
    const tr = row(node);
    for (const [field, text] of Object.entries(CELLS)) {
      tr.querySelector(`[data-field="${field}"]`).textContent = text(node);
    }
    // The memory in GiB, under its share (it comes with refreshes: heartbeats carry the share).
    if (node.memory && node.memory !== "-") {
      const detail = document.createElement("small");
      detail.textContent = node.memory;
      tr.querySelector('[data-field="memory"]').append(document.createElement("br"), detail);
    }
    for (const [field, fill] of Object.entries(BARS)) {
      const cell = tr.querySelector(`[data-field="${field}"]`);
      cell.classList.add("fleet-bar");
      cell.style.setProperty("--fill", Math.min(Math.max(fill(node), 0), 1));
    }
    tr.dataset.status = status(node);
  }

  // A heartbeat's push and a refresh may cross: a node's older live state never replaces a
  // newer one. Its hardware in words (gpus, memory) comes with refreshes only.
  function merge(update) {
    const known = nodes.get(update.id);
    const newer = !known || update.heartbeat_at >= known.heartbeat_at;
    const node = newer
      ? { ...known, ...update }
      : { ...known, gpus: update.gpus ?? known.gpus, memory: update.memory ?? known.memory };
    nodes.set(update.id, node);
    draw(node);
  }

  const charts = {
    requests: chart("chart-requests", "requests_per_second", { min: 0 }),
    tokens: chart("chart-tokens", "tokens_per_second", { min: 0 }),
    ttft: chart("chart-ttft", "ttft_p95_ms", { min: 0 }),
    e2e: chart("chart-e2e", "e2e_p95_ms", { min: 0 }),
    errors: chart("chart-errors", "error_rate", { min: 0, max: 100 }, (v) => (v === null ? null : v * 100)),
  };
  const latest = { models: {} }; // the figures the charts were last drawn from
  window.dmxFleet = { charts, nodes, latest };

  function chart(id, figure, range, scale = (v) => v) {
    const instance = new Chart(document.getElementById(id), {
      type: "line",
      data: { labels: [], datasets: [] },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        animation: false,
        spanGaps: false,
        // Points drawn: a minute alone between quiet ones has no line to show it.
        elements: { point: { radius: 2, hitRadius: 6 }, line: { borderWidth: 2 } },
        interaction: { mode: "index", intersect: false },
        plugins: {
          legend: { position: "bottom" },
          // How many requests each point stands for: a P95 of three requests is not one of 300.
          tooltip: { callbacks: { footer: (items) => items.map(requestsOf).join("\n") } },
        },
        scales: { x: { ticks: { maxTicksLimit: 7 } }, y: { beginAtZero: true, ...range } },
      },
    });
    instance.$figure = figure;
    instance.$scale = scale;
    return instance;
  }

  function requestsOf(item) {
    const count = latest.models[item.dataset.label]?.requests[item.dataIndex] ?? 0;
    return `${item.dataset.label}: ${count} request${count === 1 ? "" : "s"}`;
  }

  function drawCharts(minutes, models) {
    latest.models = models;
    const names = Object.keys(models);
    document.getElementById("fleet-no-traffic").hidden = names.length > 0;
    for (const instance of Object.values(charts)) {
      instance.data.labels = minutes;
      instance.data.datasets = names.map((name, i) => ({
        label: name,
        data: models[name][instance.$figure].map(instance.$scale),
        borderColor: palette[i % palette.length],
        backgroundColor: palette[i % palette.length],
      }));
      instance.update("none");
    }
  }

  // Every intent's hour, in the order the server sends (most requests first).
  function drawIntents(intents) {
    const body = document.querySelector("#fleet-intents tbody");
    const ms = (value) => (value === null ? "–" : `${Math.round(value)} ms`);
    body.replaceChildren(...intents.map((figures) => {
      const tr = document.createElement("tr");
      tr.dataset.intent = figures.intent;
      const cells = [
        figures.intent,
        String(figures.requests),
        `${(figures.low_confidence_share * 100).toFixed(1)} %`,
        ms(figures.ttft_p95_ms),
        ms(figures.e2e_p95_ms),
      ];
      for (const text of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      return tr;
    }));
    document.getElementById("fleet-no-intents").hidden = intents.length > 0;
  }

  function apply(message) {
    clockOffset = message.now - Date.now() / 1000;
    if (message.type === "fleet") {
      staleAfter = message.stale_after;
      const ids = new Set(message.nodes.map((node) => String(node.id)));
      for (const tr of table.querySelectorAll("tr[data-node-id]")) {
        if (!ids.has(tr.dataset.nodeId)) {
          nodes.delete(Number(tr.dataset.nodeId));
          tr.remove();
        }
      }
      message.nodes.forEach(merge);
      document.getElementById("fleet-no-nodes").hidden = message.nodes.length > 0;
      drawCharts(message.minutes, message.models);
      drawIntents(message.intents);
    } else if (message.type === "nodes") {
      message.nodes.forEach(merge);
    }
  }

  let retry = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${root.dataset.socketPath}`);
    socket.addEventListener("open", () => {
      retry = 500;
      connection.dataset.state = "live";
      connection.textContent = "live";
    });
    socket.addEventListener("message", (event) => apply(JSON.parse(event.data)));
    socket.addEventListener("close", () => {
      connection.dataset.state = "offline";
      connection.textContent = "reconnecting…";
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, MAX_RETRY_MS);
    });
  }

  apply(JSON.parse(document.getElementById("fleet-state").textContent));
  // Heartbeat ages and staleness move on between messages.
  setInterval(() => nodes.forEach((node) => {
    const tr = row(node);
    tr.querySelector('[data-field="heartbeat"]').textContent = age(node);
    tr.querySelector('[data-field="status"]').textContent = status(node);
    tr.dataset.status = status(node);
  }), 1000);
  connect();
})();
