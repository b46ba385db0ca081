// Chat page behaviour. No inline scripts anywhere (a later CSP forbids them).
// Streamed text is rendered as Markdown while it streams (static/chat/render.js: markdown-it then
// DOMPurify, the same features and allow-list as the server); on `done` the server's sanitised
// HTML of the whole answer replaces it in the same task, so nothing visibly changes (PF-X1).
(function () {
  "use strict";

  function parse(event) {
    try { return JSON.parse(event.data); } catch (e) { return null; }
  }

  // The answer's actions (Regenerate, `< i/n >` versions) come with the streaming fragment,
  // hidden until the answer is stored.
  function showActions(article) {
    var actions = article.querySelector("[data-stream-actions]");
    if (actions) actions.hidden = false;
    // A project chat's sources (templates/projects/_sources.html), drawn while it streamed.
    var sources = article.querySelector("[data-stream-sources]");
    if (sources) sources.hidden = false;
  }

  // "prompt + completion tokens (cached) · $cost · pool", as the stored answer shows it.
  function showUsage(article, payload) {
    var line = article.querySelector("[data-stream-usage]");
    var usage = payload && payload.usage;
    if (!line || !usage || !payload.pool) return;
    var text = usage.prompt_tokens + " + " + usage.completion_tokens + " tokens";
    if (usage.cached_tokens) text += " (" + usage.cached_tokens + " cached)";
    if (usage.cost_usd !== null && usage.cost_usd !== undefined) {
      text += " · $" + Number(usage.cost_usd).toFixed(6);
    }
    line.textContent = text + " · " + payload.pool;
    line.hidden = false;
  }

  // The composer (static/chat/composer.js) turns Stop back into Send.
  function ended(article) {
    document.dispatchEvent(new CustomEvent("chat:stream-end", { detail: { article: article } }));
  }

  function finish(article, source, payload) {
    source.close();
    article.classList.remove("streaming");
    article.removeAttribute("sse-connect");
    var stop = article.querySelector("button.stop");
    if (stop) stop.remove();
    showActions(article);
    showUsage(article, payload);
    var note = article.querySelector("[data-stream-note]");
    if (payload && payload.turn_id) article.id = "turn-" + payload.turn_id;
    if (payload && typeof payload.html === "string") {
      var bubble = article.querySelector("[data-stream-text]");
      bubble.classList.remove("plain");
      bubble.classList.add("markdown");
      if (window.chatRender) window.chatRender.settle(bubble, payload.html);
      else bubble.innerHTML = payload.html; // sanitised on the server
      var copy = article.querySelector("button[data-copy=answer]");
      if (copy) {
        if (bubble.textContent.trim() && article.__chatSource) copy.setAttribute("data-copy-text", article.__chatSource);
        else copy.remove();
      }
      article.classList.add(payload.status || "complete");
      if (note) {
        if (payload.status === "cancelled") note.textContent = "Stopped.";
        else if (!bubble.textContent.trim()) note.textContent = "The model gave an empty answer. Try rephrasing your message.";
        else if (payload.finish_reason === "length" && payload.usage) {
          // The completion budget ran out: the answer ends mid-thought, and says so.
          note.textContent = "Cut off at " + payload.usage.completion_tokens + " tokens.";
          note.classList.add("cut-off");
          note.setAttribute("data-cut-off", "");
          var more = article.querySelector("[data-stream-continue]");
          if (more) more.hidden = false;
        }
        else note.remove();
      }
    }
    ended(article);
  }

  function fail(article, source, message) {
    source.close();
    article.classList.remove("streaming");
    article.classList.add("failed");
    article.removeAttribute("sse-connect");
    var stop = article.querySelector("button.stop");
    if (stop) stop.remove();
    showActions(article);
    var note = article.querySelector("[data-stream-note]");
    if (note) {
      note.textContent = message || "The answer failed. Send your message again.";
      note.classList.add("error");
    }
    ended(article);
  }

  document.addEventListener("htmx:sseOpen", function (evt) {
    var article = evt.target;
    var source = evt.detail.source;
    if (!source || source.__chatBound) return;
    source.__chatBound = true;
    var text = article.querySelector("[data-stream-text]");
    // Continue: the bubble holds the cut-off answer's text; the new text streams after it.
    if (article.__chatSource === undefined) article.__chatSource = text.getAttribute("data-stream-prefix") || "";
    source.addEventListener("token", function (e) {
      var payload = parse(e);
      // A source the sse extension opened again (after a closed one) starts from the first
      // event: skip what this answer already has (event ids are the stream's numbering).
      var id = parseInt(e.lastEventId, 10);
      if (id && id <= (article.__chatLastId || 0)) return;
      if (id) article.__chatLastId = id;
      if (payload && payload.text) {
        // The whole answer so far, kept on the article (a reconnect binds a new source).
        article.__chatSource = (article.__chatSource || "") + payload.text;
        if (window.chatRender) window.chatRender.live(text, article.__chatSource);
        else text.appendChild(document.createTextNode(payload.text));
        var note = article.querySelector("[data-stream-note]");
        if (note && note.textContent === "Writing…") note.textContent = "";
      }
    });
    source.addEventListener("done", function (e) { finish(article, source, parse(e)); });
    // The output gate withdrew the answer: take back what was shown and say why.
    source.addEventListener("moderation", function (e) {
      var payload = parse(e);
      var bubble = article.querySelector("[data-stream-text]");
      if (bubble && window.chatRender) window.chatRender.settle(bubble, "");
      else if (bubble) bubble.textContent = "";
      var copy = article.querySelector("button[data-copy=answer]");
      if (copy) copy.remove();
      fail(article, source, payload && payload.message);
      showUsage(article, payload);  // the tokens generated before it was stopped are charged
      article.classList.remove("failed");
      article.classList.add("blocked");
      if (payload && payload.turn_id) article.id = "turn-" + payload.turn_id;
    });
    // A server-sent `event: error` carries data; a network error does not (the browser and the
    // sse extension reconnect on those).
    source.addEventListener("error", function (e) {
      if (e.data) {
        var payload = parse(e);
        fail(article, source, payload && payload.message);
      }
    });
  });

  // Enter sends, Shift+Enter inserts a newline (not while an IME is composing).
  document.addEventListener("keydown", function (e) {
    var box = e.target;
    if (e.key !== "Enter" || e.shiftKey || e.isComposing) return;
    if (!box.matches || !box.matches("#composer textarea")) return;
    e.preventDefault();
    box.form.requestSubmit();
  });

  // An empty box fails the textarea's `required` check, so the browser never submits it; say
  // why above the box, as the server does for a whitespace-only message. (`invalid` does not
  // bubble: listen in the capture phase.)
  document.addEventListener("invalid", function (e) {
    if (!e.target.matches || !e.target.matches("#composer textarea")) return;
    var err = document.getElementById("composer-error");
    if (err) err.textContent = "Type a message before sending.";
  }, true);

  // Once a message has gone, the box keeps only what was typed after it was sent. A new chat's
  // first answer brings a new composer (templates/chat/_turn_created.html, for the
  // conversation's address): that text and the focus move into its box, so a follow-up typed at
  // once is not lost.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var form = e.detail.elt;
    if (!form || form.id !== "composer") return;
    var box = form.querySelector("textarea");
    form.__chatSent = box ? box.value : "";
  });

  document.addEventListener("htmx:beforeSwap", function (e) {
    var form = e.detail.elt;
    if (form && form.id === "composer") form.__chatFocused = form.contains(document.activeElement);
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (!form || form.id !== "composer") return;
    if (e.detail.successful) {
      var sent = form.querySelector("textarea");
      var box = document.querySelector("#composer textarea") || sent;
      if (sent) {
        var typed = sent.value.indexOf(form.__chatSent || "") === 0 ? sent.value.slice((form.__chatSent || "").length) : "";
        sent.value = "";
        box.value = typed;
      }
      if (box !== sent && form.__chatFocused) box.focus();
      var err = document.getElementById("composer-error");
      if (err) err.textContent = "";
      var note = document.getElementById("composer-note");
      if (note) note.textContent = "";
      // static/chat/follow.js brings the new exchange into view.
    }
  });

  // The title in the header: Esc puts back the saved title and leaves the field.
  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape" || !e.target.matches || !e.target.matches("input[data-rename]")) return;
    e.preventDefault();
    e.target.value = e.target.defaultValue;
    e.target.blur();
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (!e.detail.successful || !form || !form.matches || !form.matches("form.rename")) return;
    var title = form.querySelector("input[data-rename]");
    if (title) { title.defaultValue = title.value; title.blur(); }
  });

  // Editing a message (templates/chat/_exchange.html): opening puts the caret at the end of the
  // text; Cancel or Escape closes the editor and puts the text back as it was.
  document.addEventListener("toggle", function (e) {
    var details = e.target;
    if (!details.matches || !details.matches("details[data-edit]") || !details.open) return;
    var box = details.querySelector("textarea");
    // Already focused: the person (or a script) is in the box before this event came; leave
    // their caret and selection as they are (collapsing a select-all made typing append).
    if (!box || document.activeElement === box) return;
    box.focus();
    box.setSelectionRange(box.value.length, box.value.length);
  }, true);

  function closeEditor(details) {
    var box = details.querySelector("textarea");
    if (box) box.value = box.defaultValue;
    details.open = false;
    var summary = details.querySelector("summary");
    if (summary) summary.focus();
  }

  document.addEventListener("click", function (e) {
    var cancel = e.target.closest && e.target.closest("[data-edit-cancel]");
    if (cancel) closeEditor(cancel.closest("details[data-edit]"));
  });

  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape" || !e.target.closest) return;
    var details = e.target.closest("details[data-edit][open]");
    if (!details) return;
    e.preventDefault();
    closeEditor(details);
  });
})();
