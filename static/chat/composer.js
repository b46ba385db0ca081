// The composer (issue 18 part 6): the message box grows with its text up to its CSS max-height
// and then scrolls; Send becomes Stop while an answer streams; Esc stops that answer; keyboard
// shortcuts, listed in the #shortcuts dialog that "?" opens. The chat page only. No inline
// scripts (CSP); sizes are set through the CSSOM (element.style), which the CSP allows.
//
// How the page knows an answer is streaming: its bubble is an `article.assistant.streaming`
// (templates/chat/_answer_streaming.html) until chat.js settles it on the terminal event and
// dispatches `chat:stream-end`; htmx swaps (a sent message, Regenerate, Continue) bring new ones.
(function () {
  "use strict";

  var STREAMING = "#messages article.assistant.streaming";
  var MAC = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);

  function composer() { return document.getElementById("composer"); }
  function box() { return document.querySelector("#composer textarea[data-autogrow]"); }
  function sendButton() { return document.querySelector("#composer button[data-send]"); }
  function streamingAnswer() {
    var all = document.querySelectorAll(STREAMING);
    return all.length ? all[all.length - 1] : null;
  }

  // --- auto-grow ---------------------------------------------------------------------------

  // Height follows the text: reset to one row, then take the scroll height, capped by the
  // stylesheet's max-height (static/chat/chat.css); past the cap the box scrolls. Only where
  // the browser lacks CSS field-sizing (chat.css grows the box natively elsewhere).
  var NATIVE = window.CSS && CSS.supports && CSS.supports("field-sizing", "content");

  function grow(textarea) {
    if (!textarea || NATIVE) return;  // the stylesheet's field-sizing grows it
    textarea.style.height = "auto";
    var max = parseFloat(getComputedStyle(textarea).maxHeight) || Infinity;
    // scrollHeight excludes the borders; box-sizing is border-box everywhere (chat.css).
    var borders = textarea.offsetHeight - textarea.clientHeight;
    var wanted = textarea.scrollHeight + borders;
    textarea.style.height = Math.min(wanted, max) + "px";
    textarea.style.overflowY = wanted > max ? "auto" : "hidden";
  }

  document.addEventListener("input", function (e) {
    if (!e.target.matches || !e.target.matches("#composer textarea[data-autogrow]")) return;
    grow(e.target);
    atLimit(e.target);
  });

  // --- the box's limit ----------------------------------------------------------------------

  // The box holds at most its maxlength; the browser drops what goes past it without a word, so
  // say so while the box is full. (A paste past it becomes an attached file instead:
  // static/attachments/attachments.js.)
  function atLimit(textarea) {
    var note = document.getElementById("composer-note");
    if (!note || textarea.maxLength <= 0) return;
    var full = textarea.value.length >= textarea.maxLength;
    if (full) {
      note.textContent = "The message box holds at most " + textarea.maxLength.toLocaleString("en") +
        " characters; longer text can go in as a file.";
      note.setAttribute("data-limit", "");
    } else if (note.hasAttribute("data-limit")) {
      note.textContent = "";
      note.removeAttribute("data-limit");
    }
  }

  // --- Send <-> Stop -----------------------------------------------------------------------

  function sync() {
    var button = sendButton();
    if (!button) return;
    var streaming = !!streamingAnswer();
    if (streaming === (button.getAttribute("data-state") === "stop")) return;
    if (streaming) {
      button.setAttribute("data-state", "stop");
      button.type = "button";
      button.textContent = "Stop";
      button.setAttribute("aria-label", "Stop the answer");
      button.setAttribute("aria-keyshortcuts", "Escape");
    } else {
      button.removeAttribute("data-state");
      button.type = "submit";
      button.textContent = "Send";
      button.removeAttribute("aria-label");
      button.setAttribute("aria-keyshortcuts", "Enter");
    }
  }

  // The streaming answer's own Stop button posts to turn_stop; the stream then ends with
  // `done` (status cancelled) and chat.js settles the answer.
  function stop() {
    var answer = streamingAnswer();
    var own = answer && answer.querySelector("button.stop");
    if (!own) return false;
    own.click();
    return true;
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("#composer button[data-send][data-state=stop]");
    if (!button) return;
    e.preventDefault();
    stop();
  });

  // Nothing is sent while an answer is being written (the server would answer 409): Enter and
  // a submit in that time do nothing, and the typed text stays. Capture phase: before htmx's
  // own submit listener on the form.
  document.addEventListener("submit", function (e) {
    if (e.target.id === "composer" && streamingAnswer()) {
      e.preventDefault();
      e.stopPropagation();
    }
  }, true);

  ["htmx:afterSettle", "htmx:sseOpen", "chat:stream-end"].forEach(function (name) {
    document.addEventListener(name, sync);
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    if (e.detail.elt && e.detail.elt.id === "composer") setTimeout(function () { grow(box()); }, 0);
  });

  // --- keys --------------------------------------------------------------------------------

  function inTextField(el) {
    if (!el || !el.matches) return false;
    return el.isContentEditable || el.matches("textarea, select, input:not([type=button]):not([type=submit]):not([type=checkbox]):not([type=radio]):not([type=file])");
  }

  // Esc and Shift+Esc are ours only when nothing else is open: an open dialog closes itself;
  // layout.js closes an open menu or the drawer.
  function somethingOpen() {
    return !!document.querySelector("dialog[open], details[data-menu][open], details[data-edit][open], [data-layout].drawer-open");
  }

  function say(text) {
    var status = document.getElementById("composer-status");
    if (status) status.textContent = text;
  }

  function copyLastAnswer() {
    var buttons = document.querySelectorAll("#messages article.assistant:not(.streaming) button[data-copy=answer]");
    var last = buttons[buttons.length - 1];
    if (!last) { say("There is no answer to copy yet."); return; }
    last.click(); // static/chat/render.js copies it and says so on the button
    say("Copied the last answer.");
  }

  function newChat() {
    var link = document.querySelector("a.new-chat");
    window.location.assign(link ? link.href : "/");
  }

  function openHelp() {
    var dialog = document.getElementById("shortcuts");
    if (dialog && !dialog.open) dialog.showModal();
  }

  // Capture phase, so Esc reaches us before layout.js (which closes menus on the bubble).
  window.addEventListener("keydown", function (e) {
    if (e.isComposing || e.defaultPrevented) return;
    var mod = MAC ? e.metaKey : e.ctrlKey;
    var key = e.key;
    if (key === "Escape" && !mod && !e.altKey) {
      if (somethingOpen()) return;
      if (e.shiftKey) {
        var textarea = box();
        if (textarea) { e.preventDefault(); textarea.focus(); }
        return;
      }
      if (streamingAnswer() && stop()) e.preventDefault();
      return;
    }
    if (mod && e.shiftKey && !e.altKey) {
      var letter = key.length === 1 ? key.toLowerCase() : "";
      if (letter === "o") { e.preventDefault(); newChat(); return; }
      if (letter === "c") { e.preventDefault(); copyLastAnswer(); return; }
    }
    if (key === "?" && !e.ctrlKey && !e.metaKey && !e.altKey && !inTextField(e.target) && !somethingOpen()) {
      e.preventDefault();
      openHelp();
    }
  }, true);

  document.addEventListener("click", function (e) {
    if (e.target.closest && e.target.closest("[data-shortcuts-open]")) openHelp();
  });

  // --- focus ---------------------------------------------------------------------------------

  // "Skip to message box" (the page's first link): a fragment link moves only where the next
  // Tab starts, so focus the box itself.
  document.addEventListener("click", function (e) {
    var link = e.target.closest && e.target.closest("a[data-skip-to-box]");
    var textarea = box();
    if (!link || !textarea) return;
    e.preventDefault();
    textarea.focus();
  });

  // The chat opens ready to type, unless the focus is already somewhere (a field, or a control
  // the page restored it to) or the pointer is a finger: there the box would pop the keyboard
  // up over the conversation just opened.
  function focusOnOpen() {
    var textarea = box();
    var active = document.activeElement;
    if (!textarea || (active && active !== document.body)) return;
    if (window.matchMedia && window.matchMedia("(pointer: coarse)").matches) return;
    textarea.focus({ preventScroll: true });
  }

  function start() {
    if (MAC) document.querySelectorAll("#shortcuts kbd[data-mod]").forEach(function (k) { k.textContent = "⌘"; });
    grow(box());
    sync();
    focusOnOpen();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
