// syncjobs dashboard: the overview's live part is fetched again every few
// seconds and swapped in place (the server renders it, escaped, as the page
// itself). No library, nothing fetched from elsewhere.
(function () {
  "use strict";
  // A notice after an action says what it did then: a reload later should not say it again.
  if (window.history && window.history.replaceState && /[?&]done=/.test(window.location.search)) {
    var kept = window.location.search.replace(/^\?/, "").split("&").filter(function (pair) {
      return pair.indexOf("done=") !== 0 && pair.indexOf("count=") !== 0;
    });
    window.history.replaceState(null, "", window.location.pathname + (kept.length ? "?" + kept.join("&") : ""));
  }
  var live = document.getElementById("live");
  if (!live) {
    return;
  }
  var url = live.getAttribute("data-refresh");
  var every = parseInt(live.getAttribute("data-every"), 10) || 2000;
  var failures = 0;
  // A refresh that has waited this long says the server does not answer (the counts shown are older
  // than that); a slow answer (a busy database) is still taken when it comes.
  var patience = Math.max(5000, 2 * every);
  // One that gets neither an answer nor a closed connection (a dead network path, a frozen proxy) is
  // given up on, and counts as a failure.
  var giveUp = Math.max(60000, 4 * every);

  function refresh() {
    var controller = typeof AbortController === "function" ? new AbortController() : null;
    var slow = window.setTimeout(function () { live.setAttribute("data-stale", "true"); }, patience);
    var abandon = controller && window.setTimeout(function () { controller.abort(); }, giveUp);
    fetch(url, {
      credentials: "same-origin",
      headers: { "Accept": "text/html" },
      signal: controller ? controller.signal : undefined
    })
      .then(function (response) {
        if (response.redirected || response.status === 401 || response.status === 403) {
          // The session ended: the whole page shows the login.
          window.location.reload();
          return null;
        }
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) {
          live.innerHTML = html;
          live.removeAttribute("data-stale");
          failures = 0;
        }
      })
      .catch(function () {
        failures += 1;
        live.setAttribute("data-stale", "true");
      })
      .then(function () {
        window.clearTimeout(slow);
        window.clearTimeout(abandon);
        // Slower while the server does not answer, up to a minute between tries.
        window.setTimeout(refresh, Math.min(every * Math.pow(2, failures), 60000));
      });
  }

  window.setTimeout(refresh, every);
})();
