// Page chrome shared by every page: the conversation drawer (phones) and the collapsible
// sidebar (wider screens), the account menu, the theme switch. No inline scripts (CSP).
(function () {
  "use strict";

  var PHONE = window.matchMedia("(max-width: 768px)");
  // Read by the server (templates/chat/page.html), so a collapsed sidebar is drawn collapsed
  // from the first paint.
  var COLLAPSE_COOKIE = "sidebar";
  var TZ_COOKIE = "tz";

  function layout() { return document.querySelector("[data-layout]"); }
  function toggle() { return document.getElementById("sidebar-toggle"); }

  function drawerOpen(open, focus) {
    var root = layout();
    if (!root) return;
    root.classList.toggle("drawer-open", open);
    // While the drawer is open the page behind it takes no focus or clicks (Tab stays in it).
    var main = root.querySelector("main");
    if (main) main.inert = open;
    toggle().setAttribute("aria-expanded", open ? "true" : "false");
    if (open && focus) {
      var first = root.querySelector("[data-drawer] a, [data-drawer] button, [data-drawer] input");
      if (first) first.focus();
    } else if (!open && focus) {
      toggle().focus();
    }
  }

  function collapsed(value) {
    var root = layout();
    root.classList.toggle("sidebar-collapsed", value);
    toggle().setAttribute("aria-expanded", value ? "false" : "true");
    document.cookie = COLLAPSE_COOKIE + "=" + (value ? "collapsed" : "open") +
      "; path=/; max-age=31536000; samesite=lax";
  }

  // aria-expanded says what the button controls at this width: the drawer on a phone (closed
  // at first), the sidebar elsewhere.
  function syncToggle() {
    var root = layout();
    if (!root) return;
    if (PHONE.matches) {
      toggle().setAttribute("aria-expanded", root.classList.contains("drawer-open") ? "true" : "false");
    } else {
      root.classList.remove("drawer-open");
      var main = root.querySelector("main");
      if (main) main.inert = false;
      toggle().setAttribute("aria-expanded", root.classList.contains("sidebar-collapsed") ? "false" : "true");
    }
  }

  document.addEventListener("click", function (e) {
    var target = e.target;
    if (!target.closest) return;
    if (target.closest("#sidebar-toggle")) {
      var root = layout();
      if (PHONE.matches) drawerOpen(!root.classList.contains("drawer-open"), true);
      else collapsed(!root.classList.contains("sidebar-collapsed"));
      return;
    }
    if (target.closest("[data-drawer-close]")) { drawerOpen(false, true); return; }
    // A click outside an open menu closes it.
    document.querySelectorAll("details[data-menu][open]").forEach(function (menu) {
      if (!menu.contains(target)) menu.open = false;
    });
  });

  document.addEventListener("keydown", function (e) {
    if (e.key !== "Escape") return;
    var menu = document.querySelector("details[data-menu][open]");
    if (menu) {
      menu.open = false;
      menu.querySelector("summary").focus();
      return;
    }
    var root = layout();
    if (root && root.classList.contains("drawer-open")) drawerOpen(false, true);
  });

  // A link followed inside the drawer (another conversation) closes it; a swap inside the
  // drawer itself (search results, a pinned or renamed chat) leaves it open.
  document.addEventListener("htmx:afterSwap", function (e) {
    var swapped = e.detail && e.detail.target;
    if (swapped && swapped.closest && swapped.closest("[data-drawer]")) return;
    var root = layout();
    if (root && PHONE.matches && root.classList.contains("drawer-open")) drawerOpen(false, false);
  });

  // The theme form answers an htmx post with HX-Trigger theme-changed {theme}.
  document.addEventListener("theme-changed", function (e) {
    var theme = e.detail && e.detail.theme;
    if (!theme) return;
    document.documentElement.setAttribute("data-theme", theme);
    document.querySelectorAll(".theme-pick button[name=theme]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.value === theme ? "true" : "false");
    });
  });

  // A request refused because the database cannot be reached (503, chatsite/error_pages.py)
  // swaps nothing and sends chat:unavailable {message}: shown above the message box, where the
  // typed text is kept, or in a notice at the top of the page on pages without one.
  document.addEventListener("chat:unavailable", function (e) {
    var message = e.detail && e.detail.message;
    if (!message) return;
    var target = document.getElementById("composer-error");
    if (!target) {
      target = document.getElementById("site-notice");
      if (!target) {
        target = document.createElement("p");
        target.id = "site-notice";
        target.className = "error site-notice";
        target.setAttribute("role", "alert");
        (document.querySelector("main") || document.body).prepend(target);
      }
    }
    target.textContent = message;
  });

  // The browser's IANA time zone, for the server's date groups in the sidebar
  // (conversations/sidebar.py reads this cookie; without it, the site's time zone).
  function rememberTimeZone() {
    var zone = "";
    try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { return; }
    if (!/^[A-Za-z0-9\/_+-]{1,64}$/.test(zone)) return;
    if (document.cookie.split("; ").indexOf(TZ_COOKIE + "=" + zone) !== -1) return;
    document.cookie = TZ_COOKIE + "=" + zone + "; path=/; max-age=31536000; samesite=lax";
  }

  function start() {
    rememberTimeZone();
    if (!layout()) return;
    syncToggle();
    if (PHONE.addEventListener) PHONE.addEventListener("change", syncToggle);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
