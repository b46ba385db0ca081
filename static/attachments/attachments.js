// The composer's files: picked with the file input (its dialog opened by the paperclip button), dropped onto the composer or pasted into
// it, each shown as a removable chip. They go with the message to the one upload path the page
// has (turn_create, multipart through htmx): the form's file input always holds exactly the
// chips' files. While the message is sent each chip shows its upload progress (the request's
// XMLHttpRequest upload progress). A file over the size limit is refused before anything is
// sent (the server checks again, by content); the chips clear once the message has gone and
// stay after a refusal, so one can be removed and the message sent again.
// No inline scripts (CSP); names are shown with textContent, never as HTML.
(function () {
  "use strict";
  if (window.chatAttachmentsLoaded) return;
  window.chatAttachmentsLoaded = true;

  var SVG = "http://www.w3.org/2000/svg";

  function sizeText(bytes) {
    if (bytes < 1024) return bytes + (bytes === 1 ? " byte" : " bytes");
    if (bytes < 1024 * 1024) return (bytes / 1024).toFixed(1) + " KB";
    return (bytes / (1024 * 1024)).toFixed(1) + " MB";
  }

  function fileInput(form) { return form && form.querySelector("input[type=file][name=files]"); }

  // The chips' files, kept on the input: a new pick through the dialog replaces input.files,
  // so the earlier ones are kept here and merged back.
  function picked(input) { return input.__chatPicked || (input.__chatPicked = []); }

  function setFiles(input, files) {
    input.__chatPicked = files.slice();
    var transfer = new DataTransfer();
    files.forEach(function (file) { transfer.items.add(file); });
    input.files = transfer.files;
    render(input);
  }

  function add(input, files) {
    if (!files || !files.length) return;
    setFiles(input, picked(input).concat(Array.prototype.slice.call(files)));
  }

  function removeIcon() {
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("class", "icon");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("fill", "none");
    svg.setAttribute("stroke", "currentColor");
    svg.setAttribute("stroke-width", "2");
    svg.setAttribute("stroke-linecap", "round");
    ["M18 6 6 18", "m6 6 12 12"].forEach(function (d) {
      var path = document.createElementNS(SVG, "path");
      path.setAttribute("d", d);
      svg.appendChild(path);
    });
    return svg;
  }

  function render(input) {
    var list = input.form && input.form.querySelector("[data-attachment-picked]");
    var limit = Number(input.getAttribute("data-max-bytes")) || 0;
    var problem = "";
    if (list) list.textContent = "";
    picked(input).forEach(function (file, index) {
      var item = document.createElement("li");
      item.className = "picked-file";
      var name = document.createElement("span");
      name.className = "picked-name";
      name.textContent = file.name;
      var size = document.createElement("span");
      size.className = "attachment-meta";
      size.textContent = "(" + sizeText(file.size) + ")";
      var progress = document.createElement("progress");
      progress.max = 1;
      progress.value = 0;
      progress.hidden = true;
      progress.setAttribute("aria-label", "Uploading " + file.name);
      var remove = document.createElement("button");
      remove.type = "button";
      remove.className = "chip-remove";
      remove.setAttribute("data-remove-file", String(index));
      remove.setAttribute("aria-label", "Remove " + file.name);
      remove.appendChild(removeIcon());
      item.append(name, " ", size, progress, remove);
      if (limit && file.size > limit) {
        item.classList.add("too-large");
        problem = problem || (file.name + " is " + sizeText(file.size) + "; a file can be at most " + sizeText(limit) + ".");
      }
      if (list) list.appendChild(item);
    });
    input.setCustomValidity(problem);
    var err = document.getElementById("composer-error");
    if (err && (problem || err.hasAttribute("data-file-problem"))) {
      err.textContent = problem;
      if (problem) err.setAttribute("data-file-problem", "");
      else err.removeAttribute("data-file-problem");
    }
  }

  // The native picker: its choice joins the chips already there.
  document.addEventListener("change", function (e) {
    var input = e.target;
    if (!input.matches || !input.matches("#composer input[type=file][name=files]")) return;
    var chosen = Array.prototype.slice.call(input.files || []);
    setFiles(input, picked(input).concat(chosen));
  });

  // The paperclip button opens the visually hidden input's file dialog (its choice arrives as
  // the input's change, above).
  document.addEventListener("click", function (e) {
    var attach = e.target.closest && e.target.closest("#composer [data-attach-files]");
    if (!attach) return;
    var input = fileInput(attach.form);
    if (input) input.click();
  });

  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("#composer [data-remove-file]");
    if (!button) return;
    var form = button.form;
    var input = fileInput(form);
    var files = picked(input).slice();
    files.splice(Number(button.getAttribute("data-remove-file")), 1);
    setFiles(input, files);
    var box = form.querySelector("textarea");
    if (box) box.focus(); // the removed chip took the focus with it
  });

  // --- drop and paste ------------------------------------------------------------------------

  function carriesFiles(e) {
    var types = e.dataTransfer && e.dataTransfer.types;
    return !!types && Array.prototype.indexOf.call(types, "Files") !== -1;
  }

  function dropZone(target) { return target.closest && target.closest("form[data-drop-files]"); }

  document.addEventListener("dragover", function (e) {
    if (!carriesFiles(e)) return;
    e.preventDefault(); // a file dropped beside the composer must not open in the tab
    var zone = dropZone(e.target);
    e.dataTransfer.dropEffect = zone ? "copy" : "none";
    if (zone) zone.classList.add("drop-target");
  });

  document.addEventListener("dragleave", function (e) {
    var zone = dropZone(e.target);
    if (zone && !(e.relatedTarget && zone.contains(e.relatedTarget))) zone.classList.remove("drop-target");
  });

  document.addEventListener("drop", function (e) {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    var zone = dropZone(e.target);
    if (!zone) return;
    zone.classList.remove("drop-target");
    add(fileInput(zone), e.dataTransfer.files);
  });

  // Pasted files (a screenshot, files copied in a file manager) become chips. Pasted text is
  // left to the box, unless the box could not hold it (its maxlength would cut it without a
  // word): then, as ChatGPT does, it goes in as an attached text file, and the box says so.
  document.addEventListener("paste", function (e) {
    var zone = dropZone(e.target);
    var files = e.clipboardData && e.clipboardData.files;
    if (!zone) return;
    if (files && files.length) {
      e.preventDefault();
      add(fileInput(zone), files);
      return;
    }
    var box = e.target;
    var text = e.clipboardData && e.clipboardData.getData("text/plain");
    if (!text || !box.matches("textarea") || box.maxLength <= 0) return;
    var kept = box.value.length - (box.selectionEnd - box.selectionStart);
    if (kept + text.length <= box.maxLength) return;
    e.preventDefault();
    var input = fileInput(zone);
    var count = picked(input).filter(function (f) { return f.__chatPasted; }).length;
    var file = new File([text], count ? "Pasted text " + (count + 1) + ".txt" : "Pasted text.txt", { type: "text/plain" });
    file.__chatPasted = true;
    add(input, [file]);
    var note = document.getElementById("composer-note");
    if (note) {
      note.removeAttribute("data-limit");
      note.textContent = "The pasted text (" + text.length.toLocaleString("en") + " characters) is longer than the message box holds (" +
        box.maxLength.toLocaleString("en") + "), so it is attached as a file.";
    }
  });

  // --- upload progress -----------------------------------------------------------------------

  // Per file, from the request's bytes sent: the files are the body's last parts, in order, so
  // file i is sent between (total - all files' bytes + the bytes of the files before it) and
  // that plus its size (the few bytes of each part's header are ignored).
  function showProgress(list, files, loaded, total) {
    var sum = files.reduce(function (n, f) { return n + f.size; }, 0);
    var at = total - sum;
    list.querySelectorAll("li.picked-file").forEach(function (item, i) {
      var file = files[i];
      var progress = item.querySelector("progress");
      if (!file || !progress) return;
      var done = file.size ? (loaded - at) / file.size : (loaded >= total ? 1 : 0);
      progress.value = Math.max(0, Math.min(1, done));
      at += file.size;
    });
  }

  document.addEventListener("htmx:beforeSend", function (e) {
    var form = e.detail.elt;
    if (!form || form.id !== "composer") return;
    var input = fileInput(form);
    var files = input ? picked(input).slice() : [];
    var list = form.querySelector("[data-attachment-picked]");
    if (!files.length || !list || !e.detail.xhr) return;
    list.querySelectorAll("li.picked-file").forEach(function (item) {
      item.classList.add("uploading");
      item.querySelector("progress").hidden = false;
      item.querySelector("button.chip-remove").disabled = true;
    });
    e.detail.xhr.upload.addEventListener("progress", function (p) {
      if (p.lengthComputable) showProgress(list, files, p.loaded, p.total);
    });
  });

  document.addEventListener("htmx:afterRequest", function (e) {
    var form = e.detail.elt;
    if (!form || form.id !== "composer") return;
    var input = fileInput(form);
    if (!input) return;
    if (e.detail.successful) {
      input.value = "";
      setFiles(input, []);
    } else {
      render(input); // fresh chips: no progress, removable again
    }
  });
})();
