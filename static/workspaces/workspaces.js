// Workspace pages: forms with data-confirm ask before they submit (leave, remove a member,
// withdraw an invitation). Loaded with <script src defer>; no inline handlers (CSP).
document.addEventListener("submit", (event) => {
  const message = event.target instanceof HTMLFormElement ? event.target.dataset.confirm : undefined;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});
