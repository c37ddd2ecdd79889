// Strop dashboard: the few behaviours that need a script. Every page works without it.
(function () {
  "use strict";

  // Copy a value (a new API key) to the clipboard; fall back to selecting it for Ctrl+C.
  function copyFrom(button) {
    var input = document.getElementById(button.getAttribute("data-copy-target"));
    var status = document.querySelector("[data-copy-status]");
    if (!input) return;
    function say(text) { if (status) status.textContent = text; }
    function fallback() {
      input.focus();
      input.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      say(ok ? "Copied." : "Selected: press Ctrl+C (⌘C) to copy.");
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(input.value).then(function () { say("Copied."); }, fallback);
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
