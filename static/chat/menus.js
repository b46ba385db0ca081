// The chat page's menu buttons (issue 29 items 6 and 8). No inline scripts (CSP).
//
// * Each chat's row menu in the sidebar (templates/chat/_conversation_row.html): the WAI-ARIA
//   menu button pattern (https://www.w3.org/WAI/ARIA/apg/patterns/menu-button/): Enter, Space
//   or ArrowDown open it on its first item, ArrowUp on its last; ArrowUp/ArrowDown/Home/End
//   move; Esc closes it and gives the focus back to its button; Tab or a click outside closes
//   it. "Rename" swaps the row for its title form (Esc there cancels).
// * The chat header's actions on a phone (templates/chat/_header.html): a disclosure button
//   (aria-expanded) showing the actions' panel; Esc and a click outside close it.
// The sidebar is swapped by htmx (pin, rename, search): every handler is delegated, and after a
// swap the focus goes back to the menu button of the row acted on.
(function () {
  "use strict";
  if (window.chatMenusLoaded) return;
  window.chatMenusLoaded = true;

  var lastRowId = null; // the row whose menu item was used, to refocus after the sidebar swap

  function items(menu) { return Array.prototype.slice.call(menu.querySelectorAll("[role=menuitem]")); }
  function menuOf(button) { return document.getElementById(button.getAttribute("aria-controls")); }
  function openRowMenu() { return document.querySelector("[data-row-menu-button][aria-expanded=true]"); }

  function closeRowMenu(button, focus) {
    var menu = menuOf(button);
    if (menu) menu.hidden = true;
    button.setAttribute("aria-expanded", "false");
    if (focus) button.focus();
  }

  function openRow(button, which) {
    var current = openRowMenu();
    if (current && current !== button) closeRowMenu(current, false);
    var menu = menuOf(button);
    if (!menu) return;
    menu.hidden = false;
    button.setAttribute("aria-expanded", "true");
    var all = items(menu);
    if (all.length) all[which === "last" ? all.length - 1 : 0].focus();
  }

  function move(menu, from, step) {
    var all = items(menu);
    var i = all.indexOf(from);
    var next = step === "first" ? 0 : step === "last" ? all.length - 1 : (i + step + all.length) % all.length;
    if (all[next]) all[next].focus();
  }

  function renameStart(item) {
    var form = document.getElementById(item.getAttribute("data-row-rename"));
    if (!form) return;
    var row = form.closest("li");
    row.classList.add("renaming");
    form.hidden = false;
    var input = form.querySelector("input[name=title]");
    input.focus();
    input.select();
  }

  function renameCancel(form) {
    var row = form.closest("li");
    form.hidden = true;
    row.classList.remove("renaming");
    var button = row.querySelector("[data-row-menu-button]");
    if (button) button.focus();
  }

  // --- the header's actions on a phone --------------------------------------------------------

  function headerButton() { return document.querySelector("[data-header-menu-button]"); }

  function headerOpen(open, focus) {
    var button = headerButton();
    var panel = button && document.getElementById(button.getAttribute("aria-controls"));
    if (!panel) return;
    panel.classList.toggle("open", open);
    button.setAttribute("aria-expanded", open ? "true" : "false");
    if (!open) panel.querySelectorAll("details[open]").forEach(function (d) { d.open = false; });
    if (open && focus) {
      var first = panel.querySelector("a[href], button, summary");
      if (first) first.focus();
    } else if (!open && focus) {
      button.focus();
    }
  }

  function headerIsOpen() {
    var button = headerButton();
    return !!button && button.getAttribute("aria-expanded") === "true";
  }

  // --- events ----------------------------------------------------------------------------------

  document.addEventListener("click", function (e) {
    var target = e.target;
    if (!target.closest) return;
    var rowButton = target.closest("[data-row-menu-button]");
    if (rowButton) {
      if (rowButton.getAttribute("aria-expanded") === "true") closeRowMenu(rowButton, true);
      else openRow(rowButton, "first");
      return;
    }
    var item = target.closest("[role=menu] [role=menuitem]");
    if (item) {
      var menu = item.closest("[role=menu]");
      var owner = document.querySelector("[aria-controls='" + menu.id + "']");
      lastRowId = owner ? owner.id : null;
      if (owner) closeRowMenu(owner, false);
      if (item.hasAttribute("data-row-rename")) renameStart(item);
      return;
    }
    var open = openRowMenu();
    if (open) closeRowMenu(open, false); // a click outside the open menu
    var header = target.closest("[data-header-menu-button]");
    if (header) { headerOpen(!headerIsOpen(), true); return; }
    if (headerIsOpen() && !target.closest("[data-header-actions]")) headerOpen(false, false);
  });

  // Capture phase: a key a menu uses stops here, so the page's other Esc handlers (the drawer,
  // static/chat/layout.js) do not also act on it.
  document.addEventListener("keydown", function (e) {
    var target = e.target;
    if (!target.closest) return;
    var rowButton = target.closest("[data-row-menu-button]");
    if (rowButton && (e.key === "ArrowDown" || e.key === "ArrowUp")) {
      e.preventDefault();
      openRow(rowButton, e.key === "ArrowUp" ? "last" : "first");
      return;
    }
    var menu = target.closest("[role=menu]");
    if (menu && target.matches("[role=menuitem]")) {
      var owner = document.querySelector("[aria-controls='" + menu.id + "']");
      if (e.key === "ArrowDown" || e.key === "ArrowUp" || e.key === "Home" || e.key === "End") {
        e.preventDefault();
        move(menu, target, e.key === "ArrowDown" ? 1 : e.key === "ArrowUp" ? -1 : e.key === "Home" ? "first" : "last");
      } else if (e.key === "Escape") {
        e.preventDefault();
        e.stopPropagation();
        if (owner) closeRowMenu(owner, true);
      } else if (e.key === "Tab") {
        if (owner) closeRowMenu(owner, false);
      } else if (e.key === " " && target.tagName === "A") {
        e.preventDefault(); // Space on a link item acts like Enter, as on the button items
        target.click();
      }
      return;
    }
    var rename = target.closest("form.row-rename");
    if (rename && e.key === "Escape") {
      e.preventDefault();
      e.stopPropagation();
      renameCancel(rename);
      return;
    }
    if (e.key === "Escape" && headerIsOpen()) {
      e.stopPropagation();
      headerOpen(false, true);
    }
  }, true);

  // After the sidebar is swapped (pin, rename), the focus goes back to the row's menu button.
  document.addEventListener("htmx:afterSettle", function (e) {
    if (!lastRowId || !e.detail || !e.detail.target || e.detail.target.id !== "sidebar") return;
    var button = document.getElementById(lastRowId);
    lastRowId = null;
    if (button) button.focus();
  });

  // A rename sent from a row: refocus that row's menu button after the swap.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var form = e.detail && e.detail.elt;
    if (!form || !form.matches || !form.matches("form.row-rename")) return;
    var button = form.closest("li").querySelector("[data-row-menu-button]");
    lastRowId = button ? button.id : null;
  });
})();
