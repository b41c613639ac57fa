// mbx report site: sorts tables by a header click at once; after the page has loaded, loads plotly.js (the path in
// this script's data-plotly; 4.6 MB, so it never delays the page) and draws the figures embedded as JSON, and
// switches the TFLOP/s heatmap between pairs of swept axes. No network: every file sits beside the page.
(function () {
  "use strict";
  var self = document.currentScript;
  var root = document.documentElement;
  var timing = /[?&]timing\b/.test(location.search);  // benchmarks/site_speed.py: log each mark on the console

  function mark(name) {
    root.setAttribute("data-" + name + "-ms", String(Math.round(performance.now())));
    if (timing) { console.info("mbx-timing " + name); }
  }

  // Rows past the first ones wait in <template id="summary-more"> and join the table after the page has
  // loaded, a few hundred per task (a thousand rows laid out at once would hold the page for seconds).
  function attachRows(all) {
    var more = document.getElementById("summary-more");
    if (!more) { return true; }
    for (var n = 0; (all || n < 250) && more.content.firstElementChild; n++) {
      more.parentNode.insertBefore(more.content.firstElementChild, more);
    }
    if (more.content.firstElementChild) { return false; }
    more.parentNode.removeChild(more);
    return true;
  }

  function plot(target, fig) {
    if (typeof Plotly === "undefined") {
      target.innerHTML = '<p class="plot-error">plotly.js did not load: is assets/plotly.min.js next to this page?</p>';
      return Promise.resolve();
    }
    try {
      return Plotly.newPlot(target, fig.data, fig.layout, {responsive: true, displaylogo: false}).catch(function (e) {
        failed(target, e);
      });
    } catch (e) {  // a figure plotly cannot draw says so; the rest of the page is still drawn and marked ready
      failed(target, e);
      return Promise.resolve();
    }
  }

  function failed(target, error) {
    target.innerHTML = '<p class="plot-error"></p>';
    target.firstChild.textContent = "This figure could not be drawn: " + error;
    if (window.console) { console.error("mbx figure " + target.id + ": " + error); }
  }

  // Sort a table by a column: numbers by data-value, the rest by text; rows without a value go last.
  function sortable(table) {
    table.querySelectorAll("thead th").forEach(function (th, index) {
      var ascending = true;
      th.addEventListener("click", function () {
        attachRows(true);
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var key = function (row) {
          var cell = row.cells[index];
          if (!cell) { return ""; }
          var raw = cell.getAttribute("data-value");
          return raw !== null ? parseFloat(raw) : cell.textContent.trim();
        };
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (typeof x === "number" && typeof y === "number") { return ascending ? x - y : y - x; }
          if (typeof x === "number") { return -1; }
          if (typeof y === "number") { return 1; }
          return ascending ? String(x).localeCompare(String(y)) : String(y).localeCompare(String(x));
        });
        table.setAttribute("data-sorted", th.getAttribute("data-col") + (ascending ? ":asc" : ":desc"));
        ascending = !ascending;
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  }
  document.querySelectorAll("table.sortable").forEach(sortable);

  // The heatmap of TFLOP/s/GPU for the two axes chosen in the selectors.
  function heatmap() {
    var source = document.getElementById("heatmap-data");
    if (!source) { return Promise.resolve(); }
    var heat = JSON.parse(source.textContent);
    var sx = document.getElementById("heatmap-x"), sy = document.getElementById("heatmap-y");
    var target = document.getElementById("fig-heatmap");
    var draw = function () {
      var i = parseInt(sx.value, 10), j = parseInt(sy.value, 10);
      if (i === j) {
        target.setAttribute("data-pair", "");
        if (typeof Plotly !== "undefined") { Plotly.purge(target); }
        target.innerHTML = '<p class="muted">Choose two different axes.</p>';
        return Promise.resolve();
      }
      var pair = heat.pairs[Math.min(i, j) + "|" + Math.max(i, j)];
      var x = pair.x, y = pair.y, z = pair.z, text = pair.text;
      if (i > j) {
        x = pair.y; y = pair.x;
        z = pair.x.map(function (_, c) { return pair.z.map(function (row) { return row[c]; }); });
        text = pair.x.map(function (_, c) { return pair.text.map(function (row) { return row[c]; }); });
      }
      target.innerHTML = "";
      target.setAttribute("data-pair", i + "|" + j);
      var title = "TFLOP/s/GPU: " + heat.axes[j] + " × " + heat.axes[i] + (heat.many ? " (best point over the other axes)" : "");
      return plot(target, {
        data: [{type: "heatmap", x: x, y: y, z: z, text: text, colorscale: "Viridis", hoverongaps: false,
                colorbar: {title: {text: "TFLOP/s/GPU"}},
                hovertemplate: "%{text}<br>%{z:.4g} TFLOP/s/GPU<extra></extra>"}],
        layout: {title: {text: title}, height: 460, margin: {l: 110, r: 20, t: 50, b: 80},
                 xaxis: {title: {text: heat.axes[i]}, type: "category"},
                 yaxis: {title: {text: heat.axes[j]}, type: "category"}}
      });
    };
    sx.addEventListener("change", draw);
    sy.addEventListener("change", draw);
    return draw();
  }

  // Figures one at a time, each in its own task, so the page stays responsive while they are drawn.
  function drawAll() {
    var queue = Array.prototype.slice.call(document.querySelectorAll("script.mbx-figure"));
    var next = function () {
      var el = queue.shift();
      if (!el) {
        heatmap().then(function () { mark("rendered"); });
        return;
      }
      var id = el.getAttribute("data-target");
      plot(document.getElementById(id), JSON.parse(el.textContent)).then(function () {
        if (timing) { console.info("mbx-timing " + id.replace(/-/g, "_")); }
        setTimeout(next, 0);
      });
    };
    next();
  }

  function loadPlotly() {
    mark("loaded");
    var rows = function () { if (attachRows(false)) { mark("rows"); } else { setTimeout(rows, 0); } };
    rows();
    var src = self && self.getAttribute("data-plotly");
    if (!src || !document.querySelector("script.mbx-figure, #heatmap-data")) {
      mark("rendered");
      return;
    }
    var script = document.createElement("script");
    script.src = src;
    script.onload = function () { if (timing) { console.info("mbx-timing plotly"); } drawAll(); };
    script.onerror = drawAll;  // each figure then says plotly.js did not load
    document.head.appendChild(script);
  }
  if (document.readyState === "complete") { loadPlotly(); } else { window.addEventListener("load", loadPlotly); }
})();
