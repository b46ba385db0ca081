// The composer's file picker: lists the chosen files, refuses one over the size limit before
// anything is sent (the server checks again, by content), and clears itself once the message
// has gone. No inline scripts (CSP); names are shown with textContent, never as HTML.
(function () {
  "use strict";
  if (window.chatAttachmentsLoaded) return;
  window.chatAttachmentsLoaded = true;

  function sizeText(bytes) {
    if (bytes < 1024) return bytes + " bytes";
    if (bytes < 1024 * 1024) return (bytes / 1024).toFixed(1) + " KB";
    return (bytes / (1024 * 1024)).toFixed(1) + " MB";
  }

  function picker(input) {
    var list = input.form && input.form.querySelector("[data-attachment-picked]");
    var limit = Number(input.getAttribute("data-max-bytes")) || 0;
    var problem = "";
    if (list) list.textContent = "";
    Array.prototype.forEach.call(input.files || [], function (file) {
      var item = document.createElement("li");
      item.textContent = file.name + " (" + sizeText(file.size) + ")";
      if (limit && file.size > limit) {
        item.classList.add("too-large");
        problem = problem || (file.name + " is " + sizeText(file.size) + "; a file can be at most " + sizeText(limit) + ".");
      }
      if (list) list.appendChild(item);
    });
    input.setCustomValidity(problem);
    var err = document.getElementById("composer-error");
    if (err) err.textContent = problem;
  }

  document.addEventListener("change", function (e) {
    if (e.target.matches && e.target.matches("#composer input[type=file]")) picker(e.target);
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (!form || form.id !== "composer" || !e.detail.successful) return;
    var input = form.querySelector("input[type=file]");
    if (input) {
      input.value = "";
      picker(input);
    }
  });
})();
