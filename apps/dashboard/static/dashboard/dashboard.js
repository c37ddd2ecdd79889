// Strop dashboard: the few behaviours that need a script. Every page works without it.
(function () {
  "use strict";

  // Copy a value (a new API key, an input) or a snippet (a <pre>) to the clipboard; fall back to
  // selecting it for Ctrl+C. The status line is the nearest one after the button's section.
  function copyFrom(button) {
    var input = document.getElementById(button.getAttribute("data-copy-target"));
    var scope = button.closest("section, li") || document;
    var status = scope.querySelector("[data-copy-status]") || document.querySelector("[data-copy-status]");
    if (!input) return;
    var isField = "value" in input && input.tagName !== "PRE";
    var text = isField ? input.value : input.textContent;
    function say(message) { if (status) status.textContent = message; }
    function fallback() {
      input.focus();
      if (isField) {
        input.select();
      } else {
        var range = document.createRange();
        range.selectNodeContents(input);
        window.getSelection().removeAllRanges();
        window.getSelection().addRange(range);
      }
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      say(ok ? "Copied." : "Selected: press Ctrl+C (⌘C) to copy.");
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { say("Copied."); }, fallback);
    } else {
      fallback();
    }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy-target]");
    if (button) copyFrom(button);
  });

  // Close an open menu (tenant switcher, account) with Escape or a click elsewhere.
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") return;
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      menu.removeAttribute("open");
      menu.querySelector("summary").focus();
    });
  });
  document.addEventListener("click", function (event) {
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      if (!menu.contains(event.target)) menu.removeAttribute("open");
    });
  });
})();
