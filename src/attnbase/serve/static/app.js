// attnbase serve: the value under the cursor of dense figures (head grid, attention pattern).
// No dependencies. A grid cell carries its value in data-v and a title. A pattern's values are
// one JSON matrix in the table's data-probs (query x key, null where a row has none); the
// readout names the query and key from the table's own labels (per-cell values and titles were
// most of a 128 x 128 page's bytes and of the server's work to write it).
(function () {
  // Python's "%.<p>g", as the page prints its other numbers (attnbase/formatting.py, the plain
  // style); p: the table's data-digits
  function g(v, p) {
    if (v === null || v === undefined || !isFinite(v)) return "NULL";
    if (v === 0) return "0";
    var s = Number(v.toPrecision(p));
    var e = Math.floor(Math.log10(Math.abs(s)));
    if (e < -4 || e >= p) {
      var m = (s / Math.pow(10, e)).toFixed(p - 1).replace(/\.0+$|(\.\d*?)0+$/, "$1");
      return m + "e" + (e < 0 ? "-" : "+") + (Math.abs(e) < 10 ? "0" : "") + Math.abs(e);
    }
    return s.toFixed(Math.max(0, p - 1 - e)).replace(/\.0+$|(\.\d*?)0+$/, "$1");
  }
  document.querySelectorAll("table.pattern, table.grid").forEach(function (table) {
    var section = table.closest("main");
    var out = section ? section.querySelector(".readout") : null;
    if (!out) return;
    var probs = null;
    table.addEventListener("mouseover", function (ev) {
      var td = ev.target.closest("td");
      if (!td || !table.contains(td)) return;
      var title = td.getAttribute("title");
      if (title) { out.textContent = title; return; }
      if (!table.hasAttribute("data-probs")) return;
      if (probs === null) probs = JSON.parse(table.getAttribute("data-probs"));
      var tr = td.parentElement, q = tr.rowIndex - 1, k = td.cellIndex - 1;
      var ql = tr.querySelector("th.qlabel"), kl = table.rows[0].cells[td.cellIndex];
      out.textContent = "q" + q + " " + (ql ? ql.textContent : "") + " \u2192 k" + k + " " +
        (kl ? kl.textContent : "") + ": " +
        g((probs[q] || [])[k], parseInt(table.getAttribute("data-digits"), 10));
    });
  });
})();
