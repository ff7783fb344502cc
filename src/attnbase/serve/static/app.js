// attnbase serve: the value under the cursor of dense figures (head grid, attention pattern).
// No dependencies; every cell carries its value in data-v (the grid's also a title; a pattern
// cell's readout names its query and key from the table's own labels: 16k titles at 128 x 128
// were most of the page's bytes and of its rendering).
(function () {
  document.querySelectorAll("table.pattern, table.grid").forEach(function (table) {
    var section = table.closest("main");
    var out = section ? section.querySelector(".readout") : null;
    if (!out) return;
    table.addEventListener("mouseover", function (ev) {
      var td = ev.target.closest("td[data-v]");
      if (!td) return;
      var v = td.getAttribute("data-v"), title = td.getAttribute("title");
      if (title) { out.textContent = title; return; }
      var tr = td.parentElement, q = tr.rowIndex - 1, k = td.cellIndex - 1;
      var ql = tr.querySelector("th.qlabel"), kl = table.rows[0].cells[td.cellIndex];
      out.textContent = "q" + q + " " + (ql ? ql.textContent : "") + " \u2192 k" + k + " " +
        (kl ? kl.textContent : "") + ": " + v;
    });
  });
})();
