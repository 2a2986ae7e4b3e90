// The answer to a login: keep the session's page secret where only this driver's pages read
// it (local storage belongs to one origin: scheme, host and port, so another service on this
// host cannot read it, though it may receive the session cookie), then open the page. The
// secret leaves this document's head at once. The page sends it with every request to
// /ui/api/ (page.js); without it, the cookie alone gets nothing.
"use strict";

const SECRET_KEY = "elasticrun-page-secret";

document.addEventListener("DOMContentLoaded", () => {
  const meta = document.querySelector('meta[name="elasticrun-page-secret"]');
  const secret = meta ? meta.content : "";
  if (meta) meta.remove();
  try {
    window.localStorage.setItem(SECRET_KEY, secret);
  } catch (error) {
    document.getElementById("entering").textContent =
      `This browser keeps no local storage for this page (${error}), so the page cannot ` +
      "show the job: allow site data for this address and open a new login link.";
    return;
  }
  window.location.replace("/ui"); // a same-site navigation: the Strict cookie goes along
});
