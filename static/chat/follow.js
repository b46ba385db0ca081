// Follow the stream: while the reader is at the bottom of the conversation, growth (tokens, a
// new exchange) keeps the view at the bottom; once they scroll up it stays where they put it and
// "Jump to latest" appears; scrolling back to the bottom, the button, or sending a message
// follows again.
//
// Scrolling up is seen from the input (wheel, touch, keys) as well as from `scroll`, because a
// token may arrive between the reader's scroll and its `scroll` event: following would
// otherwise pull the view back down before the reader's intent is known.
//
// Earlier exchanges of a long conversation go in *above* what the reader sees (the top
// sentinel, templates/chat/_earlier_sentinel.html, swapped for the page before it). That is
// not growth to follow: the view keeps its distance from the bottom of the conversation, so the
// exchange the reader was looking at stays exactly where it was (set in the mutation callback,
// before the frame that would show the jump, and again once the page has settled and its code
// blocks are decorated; the stylesheet turns the browser's own scroll anchoring off so it does
// not correct a second time).
(function () {
  "use strict";

  var AT_BOTTOM_PX = 32; // this close to the bottom counts as "at the bottom"
  var following = true;
  var lastTop = 0;
  var keepFromBottom = null; // while a page of earlier exchanges goes in: the distance to keep

  function messages() { return document.getElementById("messages"); }

  // The element that scrolls: #messages in the desktop layout, else the page itself.
  function scroller() {
    var box = messages();
    if (!box) return null;
    var overflow = getComputedStyle(box).overflowY;
    if (overflow === "auto" || overflow === "scroll") return box;
    return document.scrollingElement || document.documentElement;
  }

  function distanceFromBottom(el) {
    return el.scrollHeight - el.clientHeight - el.scrollTop;
  }

  function showButton(show) {
    var button = document.getElementById("jump-latest");
    if (button && button.hidden === show) button.hidden = !show;
  }

  function toBottom() {
    var el = scroller();
    if (!el) return;
    el.scrollTop = el.scrollHeight;
    lastTop = el.scrollTop;
    showButton(false);
  }

  function follow() {
    following = true;
    toBottom();
  }

  function unfollow() {
    following = false;
    var el = scroller();
    if (el) showButton(distanceFromBottom(el) > AT_BOTTOM_PX);
  }

  function onScroll() {
    var el = scroller();
    if (!el) return;
    var atBottom = distanceFromBottom(el) <= AT_BOTTOM_PX;
    if (atBottom) following = true;
    else if (el.scrollTop < lastTop - 1) following = false;
    lastTop = el.scrollTop;
    showButton(!atBottom);
  }

  function keep(el) {
    el.scrollTop = el.scrollHeight - el.clientHeight - keepFromBottom;
    lastTop = el.scrollTop;
  }

  // Growth: follow, or (not following) say there is more below. Earlier exchanges put in
  // above: keep the view where it was.
  function onGrowth() {
    var el = scroller();
    if (!el) return;
    if (keepFromBottom !== null) { keep(el); return; }
    if (following) toBottom();
    else showButton(distanceFromBottom(el) > AT_BOTTOM_PX);
  }

  function start() {
    var box = messages();
    if (!box) return;
    // Mutation callbacks run before the next paint, so a followed answer never shows a frame
    // with its new text below the fold.
    new MutationObserver(onGrowth).observe(box, { childList: true, subtree: true, characterData: true });
    box.addEventListener("scroll", onScroll, { passive: true });
    window.addEventListener("scroll", onScroll, { passive: true });
    // The reader scrolling while a page of earlier exchanges goes in takes over from keep().
    box.addEventListener("wheel", function (e) { keepFromBottom = null; if (e.deltaY < 0) unfollow(); }, { passive: true });
    box.addEventListener("touchmove", function () {
      keepFromBottom = null;
      // A finger moving the conversation: keep following only if it ends at the bottom (onScroll).
      var el = scroller();
      if (el && distanceFromBottom(el) > AT_BOTTOM_PX) unfollow();
    }, { passive: true });
    box.addEventListener("keydown", function (e) {
      if (["ArrowUp", "PageUp", "Home"].indexOf(e.key) >= 0) { keepFromBottom = null; unfollow(); }
    });
    var button = document.getElementById("jump-latest");
    if (button) button.addEventListener("click", follow);
    follow(); // a conversation opens at its latest message
  }

  function isEarlier(elt) { return !!(elt && elt.matches && elt.matches("[data-earlier]")); }

  // A page of earlier exchanges is about to take the sentinel's place: remember where the view
  // is (measured from the bottom, which the insertion above does not move). A refused cursor
  // (400) is swapped in too, so its message shows where the page would have.
  document.addEventListener("htmx:beforeSwap", function (e) {
    if (!isEarlier(e.detail.elt)) return;
    if (e.detail.xhr && e.detail.xhr.status === 400) { e.detail.shouldSwap = true; e.detail.isError = false; }
    var el = scroller();
    if (el) keepFromBottom = distanceFromBottom(el);
  });

  // The page's code blocks are decorated as it settles (render.js on `htmx:load`, which adds
  // their header rows above the view too): keep the place once more, then go back to following.
  document.addEventListener("htmx:afterSettle", function () {
    if (keepFromBottom === null) return;
    var el = scroller();
    if (el) keep(el);
    keepFromBottom = null;
  });

  // Sending a message follows its answer.
  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (form && form.id === "composer" && e.detail.successful) follow();
  });

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
