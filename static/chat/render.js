// Answers as Markdown in the browser: the live render of a streaming answer, and the code-block
// and answer decorations (highlighting, language label, Copy) on live and stored answers alike.
//
// The live render must match the stored one (core/rendering.py) so that nothing jumps
// when the server's HTML replaces it on `done`: markdown-it 14.1.0 (the version markdown-it-py
// ports) with the same preset, options and image rule, then DOMPurify with the same allow-list
// as the server's nh3 pass. Model output is untrusted (PF-X1): raw HTML is escaped by markdown-it
// (`html` off) and anything that still got through is removed by DOMPurify. Change both sides
// together; tests/browser/test_chat_render.py compares them.
//
// Needs highlight.js (window.hljs) for decorate(); markdown-it and DOMPurify only for markdown()
// (pages that show stored answers only, e.g. share pages, load neither).
(function () {
  "use strict";

  // core/rendering.py: ALLOWED_TAGS, ALLOWED_ATTRIBUTES, ALLOWED_URL_SCHEMES, LANGUAGE_CLASS.
  var TAGS = ["p", "br", "hr", "em", "strong", "s", "del", "code", "pre", "blockquote", "a",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td"];
  var ATTRIBUTES = { a: ["href", "title"], ol: ["start"], code: ["class"] };
  var URL_OK = /^(?:(?:https?|mailto):|[^a-z]|[a-z+.\-]+(?:[^a-z+.\-:]|$))/i;
  var LANGUAGE_CLASS = /^language-[A-Za-z0-9_+#.\-]{1,40}$/;
  var LINK_REL = "noopener noreferrer nofollow";

  var md = null;
  var purify = null;

  function renderer() {
    if (md) return md;
    md = window.markdownit("commonmark", { html: false, linkify: false, breaks: true })
      .enable(["table", "strikethrough"]);
    var escapeHtml = md.utils.escapeHtml;
    // ![alt](src) -> <a href="src">alt</a>: an image would be fetched on its own (a leak).
    md.renderer.rules.image = function (tokens, idx, options, env, self) {
      var token = tokens[idx];
      var src = token.attrGet("src") || "";
      var alt = self.renderInlineAsText(token.children || [], options, env) || src;
      return '<a href="' + escapeHtml(src) + '">' + escapeHtml(alt) + "</a>";
    };
    purify = window.DOMPurify(window);
    purify.addHook("uponSanitizeAttribute", function (node, data) {
      var tag = node.nodeName.toLowerCase();
      var allowed = ATTRIBUTES[tag] || [];
      if (allowed.indexOf(data.attrName) < 0) { data.keepAttr = false; return; }
      if (data.attrName === "class" && !LANGUAGE_CLASS.test(data.attrValue)) data.keepAttr = false;
    });
    purify.addHook("afterSanitizeAttributes", function (node) {
      if (node.nodeName === "A") node.setAttribute("rel", LINK_REL);
    });
    return md;
  }

  // Markdown text -> sanitised HTML (a string safe to set as innerHTML).
  function markdown(text) {
    return sanitize(renderer().render(text || ""));
  }

  // markdown-it's HTML -> the same, sanitised (renderer() must have run).
  function sanitize(html) {
    return purify.sanitize(html, {
      ALLOWED_TAGS: TAGS,
      ALLOWED_ATTR: ["href", "title", "start", "class"],
      ALLOWED_URI_REGEXP: URL_OK,
      ALLOW_DATA_ATTR: false,
      ALLOW_ARIA_ATTR: false,
    });
  }

  function languageOf(code) {
    var m = /(?:^|\s)language-(\S+)/.exec(code.className || "");
    return m ? m[1] : "";
  }

  // Highlighted HTML of the last render's code blocks, so a streaming answer's finished blocks
  // are not highlighted again on every frame.
  var highlighted = new Map();

  function highlight(code, language) {
    var hljs = window.hljs;
    if (!hljs || !language || !hljs.getLanguage(language)) return;
    var key = language + "\u0000" + code.textContent;
    var html = highlighted.get(key);
    if (html === undefined) {
      // highlight.js escapes the text it is given; its output is spans with hljs-* classes.
      html = hljs.highlight(code.textContent, { language: language, ignoreIllegals: true }).value;
      if (highlighted.size > 200) highlighted.clear();
      highlighted.set(key, html);
    }
    code.innerHTML = html;
    code.classList.add("hljs");
  }

  // Every `pre > code` in `root` gets highlighting, a language label and a Copy button, once.
  function decorate(root) {
    if (!root) return;
    // Code blocks and tables scroll sideways inside the answer: focusable, so the arrow keys
    // scroll them too (WCAG 2.1.1; axe-core's scrollable-region-focusable).
    var scrollers = root.querySelectorAll("pre, table");
    for (var s = 0; s < scrollers.length; s++) scrollers[s].tabIndex = 0;
    var blocks = root.querySelectorAll("pre > code");
    for (var i = 0; i < blocks.length; i++) {
      var code = blocks[i];
      var pre = code.parentNode;
      if (pre.parentNode && pre.parentNode.classList.contains("code-block")) continue;
      var language = languageOf(code);
      highlight(code, language);
      var wrap = document.createElement("div");
      wrap.className = "code-block";
      var head = document.createElement("div");
      head.className = "code-head";
      var label = document.createElement("span");
      label.className = "code-lang";
      label.textContent = language || "text";
      var copy = document.createElement("button");
      copy.type = "button";
      copy.className = "code-copy";
      copy.setAttribute("data-copy", "code");
      copy.setAttribute("aria-label", "Copy code");
      copy.textContent = "Copy";
      head.appendChild(label);
      head.appendChild(copy);
      pre.parentNode.insertBefore(wrap, pre);
      wrap.appendChild(head);
      wrap.appendChild(pre);
    }
  }

  function clipboardWrite(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    // Plain http on a non-local host has no async clipboard: the old way.
    return new Promise(function (resolve, reject) {
      var box = document.createElement("textarea");
      box.value = text;
      box.setAttribute("readonly", "");
      box.style.position = "fixed";
      box.style.opacity = "0";
      document.body.appendChild(box);
      box.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      box.remove();
      if (ok) resolve(); else reject(new Error("copy refused"));
    });
  }

  // What a Copy button copies: a code block's text, or the answer's Markdown source
  // (data-copy-text on the stored answer's button; the streamed text on a live one).
  function copiedText(button) {
    if (button.getAttribute("data-copy") === "code") {
      var code = button.closest(".code-block").querySelector("pre > code");
      return code ? code.textContent : "";
    }
    if (button.hasAttribute("data-copy-text")) return button.getAttribute("data-copy-text");
    var article = button.closest("article");
    return (article && article.__chatSource) || "";
  }

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button[data-copy]");
    if (!button) return;
    var label = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", label);
    clipboardWrite(copiedText(button)).then(function () {
      button.textContent = "Copied";
    }, function () {
      button.textContent = "Copy failed";
    }).then(function () {
      clearTimeout(button.__chatReset);
      button.__chatReset = setTimeout(function () { button.textContent = label; }, 1500);
    });
  });

  // Whether a key went down since the last frame. That frame paints the keystroke alone and
  // the stream's text goes in the next one: typing stays instant while an answer streams, even
  // where a frame of the stream's layout takes longer than a frame (issue 29; bench/
  // browser_long.py profiles it). Cleared by a frame callback queued after the stream's.
  var keyed = false;
  document.addEventListener("keydown", function () {
    if (keyed) return;
    keyed = true;
    requestAnimationFrame(function () { keyed = false; });
  }, true);

  // A streaming answer: render `text` into `bubble` at most once a frame.
  function live(bubble, text) {
    bubble.__chatPending = text;
    if (bubble.__chatFrame) return;
    bubble.__chatFrame = requestAnimationFrame(function frame() {
      if (keyed) { bubble.__chatFrame = requestAnimationFrame(frame); return; }
      bubble.__chatFrame = 0;
      paint(bubble, bubble.__chatPending);
    });
  }

  // The offset in `text` where its line `line` (0-based, as markdown-it's token maps count)
  // starts; -1 past the end.
  function lineStart(text, line) {
    var at = 0;
    for (var i = 0; i < line; i++) {
      at = text.indexOf("\n", at) + 1;
      if (at === 0) return -1;
    }
    return at;
  }

  // Sanitised `html` as decorated nodes appended to `bubble`; returns them.
  function append(bubble, html) {
    var holder = document.createElement("div");
    holder.innerHTML = sanitize(html);
    decorate(holder); // wraps code blocks in holder (decorate needs a parent to wrap in)
    var nodes = Array.prototype.slice.call(holder.childNodes);
    for (var i = 0; i < nodes.length; i++) bubble.appendChild(nodes[i]);
    return nodes;
  }

  // Render `text` into `bubble` with work in proportion to what is new, not to the whole
  // answer (issue 29: keystroke -> paint while an answer streams, bench/browser_long.py). In
  // CommonMark a top-level block that another has followed is closed for good, so every block
  // but the last is final: it is rendered once, appended, decorated and never touched again;
  // a frame parses and renders only the text from the start of the last block. A block counts
  // as followed only once the first line of the next is complete ("Hello\n#" could still
  // become the paragraph "Hello\n#x"). The server's HTML replaces all of it on `done`
  // (settle), so a rare difference (a link reference defined after its use) lasts only as long
  // as the stream.
  function paint(bubble, text) {
    var md = renderer();
    var state = bubble.__chatLive;
    if (!state || text.length < state.done) {
      bubble.textContent = "";
      state = bubble.__chatLive = { done: 0, live: [] };
    }
    var tail = text.slice(state.done);
    var env = {};
    var tokens = md.parse(tail, env);
    var last = -1;
    for (var i = 0; i < tokens.length; i++) {
      if (tokens[i].level === 0 && tokens[i].nesting !== -1 && tokens[i].map) last = tokens[i].map[0];
    }
    var cut = last > 0 && tail.indexOf("\r") < 0 ? lineStart(tail, last) : -1;
    for (var j = 0; j < state.live.length; j++) state.live[j].remove();
    state.live = [];
    if (cut > 0 && tail.indexOf("\n", cut) >= 0) {
      append(bubble, md.render(tail.slice(0, cut)));
      state.done += cut;
      tail = tail.slice(cut);
      env = {};
      tokens = md.parse(tail, env);
    }
    state.live = append(bubble, md.renderer.render(tokens, md.options, env));
  }

  // The answer is stored: the server's sanitised HTML replaces the live render in the same task
  // (no frame in between), decorated as the live one was, so the reader sees no change.
  function settle(bubble, html) {
    if (bubble.__chatFrame) cancelAnimationFrame(bubble.__chatFrame);
    bubble.__chatFrame = 0;
    bubble.__chatLive = null;
    bubble.innerHTML = html; // sanitised on the server
    decorate(bubble);
  }

  var ANSWER_BUBBLE = ".turn.assistant .bubble.markdown";

  // The answer bubbles in `root` (or the one `root` is in): a fragment htmx put in decorates
  // only itself, whatever else the page holds (issue 29: a page of earlier exchanges).
  function decorateAll(root) {
    root = root || document;
    var inside = root.closest && root.closest(ANSWER_BUBBLE);
    if (inside) { decorate(inside); return; }
    var bubbles = root.querySelectorAll(ANSWER_BUBBLE);
    for (var i = 0; i < bubbles.length; i++) decorate(bubbles[i]);
  }

  document.addEventListener("DOMContentLoaded", function () {
    decorateAll(document);
    // Build the renderer (markdown-it's rules, DOMPurify's hooks) while the page is idle, so
    // the first token of the first answer does not wait for it (bench/browser_bench.py).
    if (window.markdownit && window.DOMPurify) {
      var warm = function () { markdown("*warm*"); };
      if (window.requestIdleCallback) requestIdleCallback(warm, { timeout: 2000 }); else setTimeout(warm, 0);
    }
  });
  // Answers swapped in later (another version, a regenerated answer's fragment, a page of
  // earlier exchanges): htmx fires `htmx:load` on each element it puts in, once; the page's own
  // content was decorated at DOMContentLoaded (htmx's load of the body at start is skipped).
  document.addEventListener("htmx:load", function (e) {
    if (e.target !== document.body) decorateAll(e.target);
  });

  window.chatRender = {
    markdown: markdown, decorate: decorate, live: live, settle: settle, paint: paint,
  };
})();
