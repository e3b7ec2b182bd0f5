// osm --html: shows one step of the document osm wrote into #osm-data at a time. Every number
// on the page is text osm made from its records; this script only picks the step to show
// (buttons, keys, the address's #step=K) and lights the cells of its block or tile.
(function () {
  "use strict";
  var doc = JSON.parse(document.getElementById("osm-data").textContent);
  var steps = doc.steps;
  var n = steps.length;
  var current = -1;
  var cells = [];  // a trace: cells[i]; a matrix: cells[r][c]
  var groups = [];  // a trace: the block boxes, and the cell range each holds
  var box = null;  // the lit tile's outline (a matrix)

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = text; }
    return e;
  }

  function shade(e, p) {
    if (p === null || p === undefined) { e.classList.add("masked"); return; }
    e.style.setProperty("--p", String(p));
    if (p > 0.6) { e.classList.add("dark"); }
  }

  function buildVector(v) {
    var drawing = $("drawing");
    drawing.className = "vector";
    v.groups.forEach(function (range) {
      var g = el("div", "group");
      for (var i = range[0]; i < range[1]; i++) {
        var c = el("span", "cell");
        c.appendChild(el("span", "value", v.cells[i]));
        c.appendChild(el("span", "index", String(i)));
        shade(c, v.shade[i]);
        g.appendChild(c);
        cells[i] = c;
      }
      groups.push({ box: g, start: range[0], stop: range[1] });
      drawing.appendChild(g);
    });
    $("about").textContent = v.about;
  }

  function buildMatrix(m) {
    var drawing = $("drawing");
    drawing.style.position = "relative";
    var table = el("table", "matrix " + m.level);
    var traced = m.traced_rows || [m.row];
    var head = el("tr");
    head.appendChild(el("th", "", m.level === "tile" ? "tile" : ""));
    for (var k = 0; k < m.cols; k++) {
      head.appendChild(el("th", m.col === k ? "traced" : "", String(k)));
    }
    table.appendChild(head);
    for (var r = 0; r < m.rows; r++) {
      var tr = el("tr");
      tr.appendChild(el("th", traced.indexOf(r) >= 0 ? "traced" : "", String(r)));
      cells.push([]);
      for (var c = 0; c < m.cols; c++) {
        var td = el("td", "", m.cells ? m.cells[r][c] : "");
        var ti = Math.floor(r / m.bq), tj = Math.floor(c / m.bk);
        if (m.shade) { shade(td, m.shade[r][c]); }
        if (m.skip[ti] && m.skip[ti][tj]) { td.classList.add("skip"); }
        else if (m.partial[ti] && m.partial[ti][tj]) { td.classList.add("partial"); }
        if (c > 0 && c % m.bk === 0) { td.classList.add("tile-left"); }
        if (r > 0 && r % m.bq === 0) { td.classList.add("tile-top"); }
        if (traced.indexOf(r) >= 0) { td.classList.add("traced"); }
        if (m.col !== null && c === m.col) { td.classList.add("traced-key"); }
        tr.appendChild(td);
        cells[r].push(td);
      }
      table.appendChild(tr);
    }
    drawing.appendChild(table);
    box = el("div", "outline");
    drawing.appendChild(box);
    $("about").textContent = m.about;
  }

  function lightVector(k) {
    var seen = {};
    for (var j = 0; j < k; j++) {
      var was = steps[j].lit || [0, 0];
      for (var i = was[0]; i < was[1]; i++) { seen[i] = true; }
    }
    var lit = steps[k].lit || [0, 0];  // the sink lights no score
    cells.forEach(function (c, i) {
      c.classList.toggle("unseen", !seen[i] && (i < lit[0] || i >= lit[1]));
    });
    groups.forEach(function (g) {
      g.box.classList.toggle("lit", g.start < lit[1] && g.stop > lit[0]);
      g.box.classList.toggle("seen", !!seen[g.start]);
    });
  }

  function lightMatrix(k) {
    var lit = steps[k].lit;
    cells.forEach(function (row, r) {
      row.forEach(function (td, c) {
        var on = lit !== null && r >= lit[0] && r < lit[1] && c >= lit[2] && c < lit[3];
        td.classList.toggle("lit", on);
        td.classList.toggle("skipped", on && !!steps[k].skipped);
      });
    });
    placeBox(k);
  }

  function placeBox(k) {
    var lit = steps[k].lit;
    if (!box) { return; }
    if (lit === null) { box.style.display = "none"; return; }
    var a = cells[lit[0]][lit[2]].getBoundingClientRect();
    var b = cells[lit[1] - 1][lit[3] - 1].getBoundingClientRect();
    var drawing = $("drawing"), at = drawing.getBoundingClientRect();
    var x = a.left - at.left + drawing.scrollLeft, y = a.top - at.top + drawing.scrollTop;
    box.style.display = "block";
    box.classList.toggle("skipped", !!steps[k].skipped);
    box.style.left = (x - 2) + "px";
    box.style.top = (y - 2) + "px";
    box.style.width = (b.right - a.left - 2) + "px";
    box.style.height = (b.bottom - a.top - 2) + "px";
    // a matrix larger than its box scrolls to the lit tile
    var w = b.right - a.left, h = b.bottom - a.top;
    if (x < drawing.scrollLeft || x + w > drawing.scrollLeft + drawing.clientWidth) {
      drawing.scrollLeft = Math.max(0, x - 24);
    }
    if (y < drawing.scrollTop || y + h > drawing.scrollTop + drawing.clientHeight) {
      drawing.scrollTop = Math.max(0, y - 24);
    }
  }

  // one row: (name, value) lines; several rows (doc.state_head): a line a row, the
  // vectors of m, l and O a Q tile holds as its columns
  function fillState(rows) {
    var table = $("state-table");
    table.textContent = "";
    table.classList.toggle("rows", !!doc.state_head);
    if (doc.state_head) {
      var head = el("tr");
      doc.state_head.forEach(function (h) { head.appendChild(el("th", "", h)); });
      table.appendChild(head);
    }
    rows.forEach(function (row) {
      var tr = el("tr");
      tr.appendChild(el("th", "", row[0]));
      for (var j = 1; j < row.length; j++) { tr.appendChild(el("td", "value", row[j])); }
      table.appendChild(tr);
    });
  }

  // a line of arithmetic wraps only between its words, never inside "-inf" or "exp(5−5)"
  function words(line) {
    var div = el("div", "line");
    line.split(" ").forEach(function (word, i) {
      if (i) { div.appendChild(document.createTextNode(" ")); }
      div.appendChild(el("span", "word", word));
    });
    return div;
  }

  function fillLines(sections) {
    var lines = $("lines");
    lines.textContent = "";
    sections.forEach(function (s) {
      if (s.title) { lines.appendChild(el("div", "section-title", s.title)); }
      s.lines.forEach(function (line) { lines.appendChild(words(line)); });
    });
  }

  function fillBytes(b) {
    var list = $("bytes");
    list.textContent = "";
    b.text.forEach(function (t) { list.appendChild(el("li", "", t)); });
    var share = b.end > 0 ? Math.min(1, (b.read + b.written) / b.end) : 0;
    $("bar-fill").style.width = (100 * share).toFixed(2) + "%";
  }

  function large() { return document.documentElement.classList.contains("large"); }

  function address(k) {
    return "#step=" + (k + 1) + (large() ? "&large" : "");
  }

  function follow(k) {
    var want = address(k);
    if (location.hash === want) { return; }
    try {
      history.replaceState(null, "", want);
    } catch (e) {  // a browser that refuses it for file:// pages
      location.replace(want);
    }
  }

  function show(k) {
    k = Math.max(0, Math.min(n - 1, k));
    current = k;
    var s = steps[k];
    $("step-title").textContent = s.title;
    $("where").textContent = "step " + (k + 1) + " of " + n;
    if (doc.vector) { lightVector(k); } else { lightMatrix(k); }
    fillState(s.state);
    fillLines(s.sections);
    fillBytes(s.bytes);
    $("final").textContent = k === n - 1 ? doc.final.join("\n") : "";
    $("first").disabled = $("back").disabled = k === 0;
    $("next").disabled = $("last").disabled = k === n - 1;
    document.body.dataset.step = String(k + 1);
    follow(k);
  }

  function fromAddress() {
    var m = /(?:^#|&)step=(\d+)/.exec(location.hash);
    var big = /(?:^#|&)large(?:&|$)/.test(location.hash);
    setLarge(big);
    return m ? parseInt(m[1], 10) - 1 : 0;
  }

  function setLarge(on) {
    document.documentElement.classList.toggle("large", on);
    $("large").setAttribute("aria-pressed", on ? "true" : "false");
    if (current >= 0) { placeBox(current); follow(current); }
  }

  function onKey(e) {
    if (e.ctrlKey || e.metaKey || e.altKey) { return; }  // the browser's own (zoom, history)
    var onButton = e.target && e.target.tagName === "BUTTON";
    var key = e.key;
    if (onButton && (key === "Enter" || key === " ")) { return; }  // the button's own click
    if (key === "ArrowRight" || key === "ArrowDown" || key === "PageDown" || key === " " ||
        key === "n") {
      show(current + 1);
    } else if (key === "ArrowLeft" || key === "ArrowUp" || key === "PageUp" || key === "b" ||
               key === "p") {
      show(current - 1);
    } else if (key === "Home" || key === "g") {
      show(0);
    } else if (key === "End" || key === "G") {
      show(n - 1);
    } else if (key === "+" || key === "=") {
      setLarge(true);
    } else if (key === "-") {
      setLarge(false);
    } else {
      return;
    }
    e.preventDefault();
  }

  (doc.intro || []).forEach(function (line) { $("intro").appendChild(el("p", "", line)); });
  if (!n) {  // nothing to step through (no keys): say so, and leave the rest empty
    $("step-title").textContent = "no steps: nothing was folded";
    $("controls").hidden = true;
    return;
  }
  $("bytes-about").textContent = doc.bytes_about;
  if (doc.vector) { buildVector(doc.vector); } else { buildMatrix(doc.matrix); }
  $("first").addEventListener("click", function () { show(0); });
  $("back").addEventListener("click", function () { show(current - 1); });
  $("next").addEventListener("click", function () { show(current + 1); });
  $("last").addEventListener("click", function () { show(n - 1); });
  $("large").addEventListener("click", function () { setLarge(!large()); });
  document.addEventListener("keydown", onKey);
  window.addEventListener("hashchange", function () { show(fromAddress()); });
  window.addEventListener("resize", function () { if (current >= 0) { placeBox(current); } });
  show(fromAddress());
}());
