// attnbase serve: the value under the cursor of dense figures (head grid, attention pattern).
// No dependencies; every cell carries its value in data-v and a title.
(function () {
  document.querySelectorAll("table.pattern, table.grid").forEach(function (table) {
    var section = table.closest("main");
    var out = section ? section.querySelector(".readout") : null;
    if (!out) return;
    table.addEventListener("mouseover", function (ev) {
      var td = ev.target.closest("td[data-v]");
      if (td) out.textContent = td.getAttribute("title") || td.getAttribute("data-v");
    });
  });
})();
