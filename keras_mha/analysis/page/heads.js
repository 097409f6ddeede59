// keras-mha heads: the role grid and, for a clicked head, its attention token to token.
// Reads the JSON in <script id="heads-data">; draws with plain DOM and SVG (no library).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("heads-data").textContent);
  const svgNS = "http://www.w3.org/2000/svg";
  let selected = null;

  function element(tag, attributes, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function decode(example) {
    // uint8 weights (x 255), layers x heads x tokens x tokens, base64.
    if (!example.weights) {
      const bytes = atob(example.attention);
      example.weights = new Uint8Array(bytes.length);
      for (let i = 0; i < bytes.length; i++) example.weights[i] = bytes.charCodeAt(i);
    }
    return example.weights;
  }

  function weight(example, layer, head, query, key) {
    const n = example.tokens.length;
    const heads = data.heads_per_layer_max;
    return decode(example)[((layer * heads + head) * n + query) * n + key] / 255;
  }

  function buildGrid() {
    const table = document.getElementById("grid");
    const header = element("tr");
    header.appendChild(element("th", {}, "layer \\ head"));
    for (let h = 0; h < data.heads_per_layer_max; h++) header.appendChild(element("th", {}, h));
    table.appendChild(header);
    data.layers.forEach(function (layer, l) {
      const row = element("tr");
      row.appendChild(element("th", { title: layer.name }, l));
      layer.heads.forEach(function (head, h) {
        const cell = element("td", {
          "data-layer": l, "data-head": h, title: layer.name + ", head " + h + ": " + head.role,
        }, head.label);
        cell.style.background = head.color;
        if (head.dark) cell.classList.add("dark");
        cell.addEventListener("click", function () { select(l, h); });
        row.appendChild(cell);
      });
      table.appendChild(row);
    });
    const legend = document.getElementById("legend");
    data.legend.forEach(function (entry) {
      const item = element("span");
      const swatch = element("i");
      swatch.style.background = entry.color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(entry.label + " = " + entry.role));
      legend.appendChild(item);
    });
    const choice = document.getElementById("sentence");
    data.examples.forEach(function (example, i) {
      choice.appendChild(element("option", { value: i }, example.text));
    });
    choice.addEventListener("change", function () { if (selected) draw(); });
  }

  function select(layer, head) {
    document.querySelectorAll("td.selected").forEach(function (c) { c.classList.remove("selected"); });
    document.querySelector('td[data-layer="' + layer + '"][data-head="' + head + '"]')
      .classList.add("selected");
    selected = { layer: layer, head: head };
    draw();
  }

  function draw() {
    const info = data.layers[selected.layer];
    const head = info.heads[selected.head];
    document.getElementById("head-title").textContent =
      "layer " + selected.layer + " (" + info.name + "), head " + selected.head + ": " + head.role;
    const stats = document.getElementById("head-stats");
    stats.textContent = Object.entries(head.statistics)
      .filter(function (pair) { return pair[1] !== null; })
      .map(function (pair) { return pair[0] + " " + pair[1].toFixed(3); }).join(" · ");
    const container = document.getElementById("attention");
    container.textContent = "";
    if (!data.examples.length) return;
    const example = data.examples[Number(document.getElementById("sentence").value) || 0];
    const n = example.tokens.length;
    const rowHeight = 18, width = 420, left = 120, right = width - 120;
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", n * rowHeight + 10);
    const lines = [];
    for (let q = 0; q < n; q++) {
      for (let k = 0; k < n; k++) {
        const w = weight(example, selected.layer, selected.head, q, k);
        if (w < 0.02) continue;
        const line = document.createElementNS(svgNS, "line");
        line.setAttribute("x1", left + 4); line.setAttribute("y1", q * rowHeight + 14);
        line.setAttribute("x2", right - 4); line.setAttribute("y2", k * rowHeight + 14);
        line.setAttribute("stroke", head.color === "#D9D9D9" ? "#555" : head.color);
        line.setAttribute("stroke-width", 1 + 3 * w);
        line.setAttribute("stroke-opacity", w);
        line.setAttribute("data-query", q);
        svg.appendChild(line);
        lines.push(line);
      }
    }
    function label(x, anchor, i, side) {
      const text = document.createElementNS(svgNS, "text");
      text.setAttribute("x", x); text.setAttribute("y", i * rowHeight + 18);
      text.setAttribute("text-anchor", anchor);
      text.setAttribute("class", "token " + side);
      text.textContent = example.tokens[i];
      if (side === "query") {
        text.addEventListener("mouseenter", function () {
          lines.forEach(function (l) { l.style.display = Number(l.getAttribute("data-query")) === i ? "" : "none"; });
        });
        text.addEventListener("mouseleave", function () { lines.forEach(function (l) { l.style.display = ""; }); });
      }
      svg.appendChild(text);
    }
    for (let i = 0; i < n; i++) { label(left, "end", i, "query"); label(right, "start", i, "key"); }
    container.appendChild(svg);
  }

  buildGrid();
})();
