// Temporary chats (issue 18 part 12), on the chat page only.
//
// - The new-chat page's "Temporary chat" switch shows the banner before the first message is
//   sent (the switch itself goes with that message: it belongs to the composer's form).
// - A temporary chat's page deletes the chat as it goes away: on `pagehide` (leaving, reloading,
//   closing the tab; unlike `unload` it also fires on phones and keeps the page bfcache-able) a
//   beacon POSTs to the banner's data-temporary-discard URL with the CSRF token in its body.
//   navigator.sendBeacon is queued by the browser and outlives the page. If it never arrives
//   (the browser crashed, no network) the server deletes the chat CHAT_ZDR_TTL_S after its
//   last turn (conversations/retention.py).
(function () {
  "use strict";

  document.addEventListener("change", function (event) {
    var toggle = event.target.closest && event.target.closest("[data-temporary-toggle]");
    if (!toggle) return;
    var preview = document.querySelector("[data-temporary-preview]");
    if (preview) preview.hidden = !toggle.checked;
  });

  window.addEventListener("pagehide", function () {
    var banner = document.querySelector("[data-temporary-discard]");
    var token = document.querySelector("input[name=csrfmiddlewaretoken]");
    if (!banner || !token || !navigator.sendBeacon) return;
    var body = new FormData();
    body.append("csrfmiddlewaretoken", token.value);
    navigator.sendBeacon(banner.dataset.temporaryDiscard, body);
  });
})();
