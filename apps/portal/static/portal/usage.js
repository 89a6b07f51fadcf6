// The usage page's charts, drawn from the numbers the page carries (#usage-data); the same
// numbers are in the table under them for readers without JavaScript.
(() => {
  const data = JSON.parse(document.getElementById("usage-data").textContent);
  const palette = ["#417690", "#79aec8", "#e0a800", "#5b9a68", "#b35c44", "#8e6bb3", "#4db6ac"];
  const labels = data.days.map((day) => day.slice(5)); // MM-DD
  const common = {
    responsive: true,
    maintainAspectRatio: false,
    animation: false,
    plugins: { legend: { position: "bottom" } },
    scales: { y: { beginAtZero: true, ticks: { precision: 0 } } },
  };
  window.dmxCharts = {
    requests: new Chart(document.getElementById("requests-chart"), {
      type: "bar",
      data: { labels, datasets: [{ label: "Requests", data: data.requests, backgroundColor: palette[0] }] },
      options: { ...common, plugins: { legend: { display: false } } },
    }),
    tokens: new Chart(document.getElementById("tokens-chart"), {
      type: "bar",
      data: {
        labels,
        datasets: Object.entries(data.tokens_by_model).map(([model, values], i) => ({
          label: model, data: values, backgroundColor: palette[i % palette.length],
        })),
      },
      options: { ...common, scales: { x: { stacked: true }, y: { ...common.scales.y, stacked: true } } },
    }),
    // Costs come as decimal strings: drawn as numbers, never added up here (the table and the
    // statement carry the exact sums).
    cost: new Chart(document.getElementById("cost-chart"), {
      type: "bar",
      data: {
        labels,
        datasets: Object.entries(data.cost_by_model).map(([model, values], i) => ({
          label: model, data: values.map(Number), backgroundColor: palette[i % palette.length],
        })),
      },
      options: {
        ...common,
        plugins: {
          ...common.plugins,
          tooltip: {
            callbacks: {
              label: (item) => `${item.dataset.label}: ${data.cost_by_model[item.dataset.label][item.dataIndex]} ${data.currency}`,
            },
          },
        },
        scales: { x: { stacked: true }, y: { beginAtZero: true, stacked: true } },
      },
    }),
  };
})();
