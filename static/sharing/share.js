// The owner's share page (templates/sharing/manage.html): a Copy button beside each link, as
// peers have. The async clipboard where the page is a secure context; otherwise the link's own
// field is selected and copied the old way (plain http on a non-local host).
(function () {
  "use strict";

  function copy(field) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(field.value);
    return new Promise(function (resolve, reject) {
      field.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      if (ok) resolve(); else reject(new Error("copy refused"));
    });
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button[data-copy-link]");
    if (!button) return;
    var field = document.getElementById(button.getAttribute("data-copy-link"));
    if (!field) return;
    var status = button.parentNode.querySelector("[data-copy-status]");
    copy(field).then(function () {
      button.textContent = "Copied";
      if (status) status.textContent = "Link copied.";
    }, function () {
      field.select();
      button.textContent = "Copy";
      if (status) status.textContent = "Copying was refused: the link is selected, press Ctrl+C.";
    }).then(function () {
      clearTimeout(button.__shareReset);
      button.__shareReset = setTimeout(function () { button.textContent = "Copy"; }, 1500);
    });
  });
})();
