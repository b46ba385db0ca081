// The project page (templates/projects/project.html): Enter sends the new-chat box (Shift+Enter
// is a new line), as in a chat; the box is a plain form post, so it works without this too.
(function () {
  "use strict";
  document.addEventListener("keydown", function (e) {
    var box = e.target;
    if (e.key !== "Enter" || e.shiftKey || e.isComposing) return;
    if (!box.matches || !box.matches("#project-composer textarea")) return;
    e.preventDefault();
    if (box.value.trim()) box.form.requestSubmit();
  });
})();
