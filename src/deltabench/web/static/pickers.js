// Run pickers: the search box of a form hides the options of that form's run lists that do not contain every
// word typed (case-insensitive). The chosen run stays visible; without JavaScript the lists work unfiltered.
(function () {
  "use strict";
  document.querySelectorAll("form.picker-form").forEach(function (form) {
    var box = form.querySelector("input.run-filter");
    if (!box) { return; }
    box.addEventListener("input", function () {
      var words = box.value.toLowerCase().split(/\s+/).filter(Boolean);
      form.querySelectorAll("select.run-picker option").forEach(function (opt) {
        if (!opt.value || opt.selected) { opt.hidden = false; return; }
        var text = (opt.textContent + " " + opt.value).toLowerCase();
        opt.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
      });
    });
  });
})();
