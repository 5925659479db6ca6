/* sqlmq dashboard: bulk repairs.
 *
 * - The archive browser's selection: "select all on this page" ticks every row, "select
 *   all matching this filter" sends the filter instead of the rows (scope=filter); the
 *   repair buttons wait for a selection. The server confirms with the count, as without
 *   this script.
 * - A bulk repair's page follows its job (/api/operations/ID) until it ends, then shows
 *   the result or the failure. Without this script the page reloads itself.
 */
(function () {
  "use strict";

  function all(selector, root) {
    return Array.prototype.slice.call((root || document).querySelectorAll(selector));
  }

  function number(n) {
    return Number(n).toLocaleString("en-US");
  }

  // ---- the selection ----------------------------------------------------------------------

  var form = document.querySelector("form[data-bulk]");
  if (form) {
    var pageBox = form.querySelector("[data-select-page]");
    var matchingBox = form.querySelector("[data-select-matching]");
    var said = form.querySelector("[data-selected]");
    // not form.id: the form's fields named "id" stand in for that property
    var formId = form.getAttribute("id");
    var rows = function () {
      return all('input[type="checkbox"][name="id"][form="' + formId + '"]');
    };

    var update = function () {
      var boxes = rows();
      var every = matchingBox.checked;
      boxes.forEach(function (box) {
        box.disabled = every;
        if (every) box.checked = true;
      });
      var ticked = boxes.filter(function (box) { return box.checked; }).length;
      pageBox.checked = every || (ticked > 0 && ticked === boxes.length);
      pageBox.indeterminate = !every && ticked > 0 && ticked < boxes.length;
      said.textContent = every ? "every archived message matching this filter" :
        ticked ? number(ticked) + " selected" : "none selected";
      all("[data-repair]", form).forEach(function (button) {
        button.disabled = !every && ticked === 0;
      });
    };

    pageBox.addEventListener("change", function () {
      if (!pageBox.checked) matchingBox.checked = false;
      rows().forEach(function (box) { box.checked = pageBox.checked; });
      update();
    });
    matchingBox.addEventListener("change", function () {
      if (!matchingBox.checked) rows().forEach(function (box) { box.checked = false; });
      update();
    });
    document.addEventListener("change", function (event) {
      var box = event.target;
      if (box instanceof HTMLInputElement && box.name === "id" &&
          box.getAttribute("form") === formId) update();
    });
    update();
  }

  // ---- a bulk repair's progress -------------------------------------------------------------

  var job = document.querySelector("[data-operation]");
  if (!job || job.getAttribute("data-state") !== "running") return;
  var bar = job.querySelector("[data-progress]");
  var text = job.querySelector("[data-progress-text]");
  var result = job.querySelector("[data-result]");
  var failure = job.querySelector("[data-error]");

  function show(found) {
    bar.max = Math.max(found.total, 1);
    bar.value = found.done;
    text.textContent = number(found.done) + " of " + number(found.total) + " done" +
      (found.state === "running" ? "…" : "");
    job.setAttribute("data-state", found.state);
    if (found.state === "done") {
      result.textContent = found.result;
      result.hidden = false;
    } else if (found.state === "failed") {
      failure.querySelector(".message").textContent = found.error;
      failure.hidden = false;
    }
  }

  function poll() {
    fetch(job.getAttribute("data-operation"), {credentials: "same-origin",
                                               headers: {"Accept": "application/json"}})
      .then(function (response) {
        return response.json().then(function (found) {
          if (!response.ok) {
            var error = new Error(found.error || String(response.status));
            error.status = response.status;
            throw error;
          }
          return found;
        });
      })
      .then(function (found) {
        show(found);
        if (found.state === "running") window.setTimeout(poll, 400);
      })
      .catch(function (error) {
        if (error.status === 404) {  // the dashboard restarted: the job is gone
          failure.querySelector(".message").textContent = error.message;
          failure.hidden = false;
          return;
        }
        text.textContent = "progress out of reach (" + (error.message || error) +
          "); asking again";
        window.setTimeout(poll, 2000);
      });
  }

  poll();
})();
