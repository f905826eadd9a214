"use strict";
// Builds the caption table from the embedded JSON: sort (header click), search, worst/best first,
// and a detail row per caption. Text goes in through textContent only.
(function () {
  const data = JSON.parse(document.getElementById("data").textContent);
  const compare = data.mode === "compare";
  const systems = data.systems;
  const key = systems[0].score_key;
  const PAGE = 100;
  let shown = PAGE;
  const open = new Set();

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "text") node.textContent = value;
      else if (name === "class") node.className = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }
  const fmt = (v, digits = 3) => (v === null || v === undefined ? "-" : v.toFixed(digits));
  const diff = (item) => {
    const [a, b] = item.rows;
    return a.score === null || b.score === null ? null : b.score - a.score;
  };

  // columns: label, value getter (for sorting), cell builder
  const columns = [{ label: "id", get: (it) => it.id, cell: (it) => el("td", { text: it.id }) }];
  if (compare) {
    systems.forEach((s, k) => {
      const tag = k === 0 ? "A" : "B";
      columns.push({ label: `caption ${tag}`, get: (it) => it.rows[k].caption, cell: (it) => el("td", { text: it.rows[k].caption }) });
    });
    systems.forEach((s, k) => {
      const tag = k === 0 ? "A" : "B";
      columns.push({ label: `${key} ${tag}`, get: (it) => it.rows[k].score, cell: (it) => el("td", { class: "num", text: fmt(it.rows[k].score) }) });
    });
    columns.push({
      label: "B - A", id: "diff", get: diff,
      cell: (it) => { const d = diff(it); return el("td", { class: "num " + (d > 0 ? "pos" : d < 0 ? "neg" : ""), text: d === null ? "-" : (d > 0 ? "+" : "") + d.toFixed(3) }); },
    });
  } else {
    columns.push({ label: "image", get: (it) => it.image_id || "", cell: (it) => el("td", { text: it.image_id || "" }) });
    columns.push({ label: "caption", get: (it) => it.rows[0].caption, cell: (it) => el("td", { text: it.rows[0].caption }) });
    columns.push({ label: key, id: "score", get: (it) => it.rows[0].score, cell: (it) => el("td", { class: "num", text: fmt(it.rows[0].score) }) });
    systems[0].components.forEach((c, j) => columns.push({
      label: c.replace(key + "_", ""), get: (it) => it.rows[0].parts[j], cell: (it) => el("td", { class: "num", text: fmt(it.rows[0].parts[j]) }),
    }));
    if (key === "qace") columns.push({ label: "questions", get: (it) => it.rows[0].n_questions, cell: (it) => el("td", { class: "num", text: String(it.rows[0].n_questions ?? "-") }) });
  }
  columns.push({
    label: "flags", get: (it) => flagsOf(it).join(" "),
    cell: (it) => el("td", {}, ...flagsOf(it).map((f) => el("span", { class: "flag", text: f }))),
  });
  function flagsOf(item) { return [...new Set(item.rows.flatMap((r) => r.flags))]; }

  const orders = compare
    ? [["disagreement", "biggest disagreement", (it) => (diff(it) === null ? null : Math.abs(diff(it))), -1], ["b-better", "B better first", diff, -1], ["a-better", "A better first", diff, 1]]
    : [["worst", "worst first", (it) => it.rows[0].score, 1], ["best", "best first", (it) => it.rows[0].score, -1]];
  let sort = { get: orders[0][2], dir: orders[0][3], column: null, button: orders[0][0] };

  const search = document.getElementById("search");
  const thead = document.querySelector("#table thead");
  const tbody = document.querySelector("#table tbody");
  const count = document.getElementById("count");
  const more = document.getElementById("more");
  const buttons = document.getElementById("order-buttons");

  for (const [id, label, get, dir] of orders) {
    const b = el("button", { type: "button", id: "order-" + id, text: label });
    b.addEventListener("click", () => { sort = { get, dir, column: null, button: id }; shown = PAGE; render(); });
    buttons.append(b);
  }
  const headRow = el("tr");
  columns.forEach((c, i) => {
    const th = el("th", { text: c.label, "data-column": String(i) });
    th.addEventListener("click", () => {
      const dir = sort.column === i ? -sort.dir : 1;
      sort = { get: c.get, dir, column: i, button: null };
      render();
    });
    headRow.append(th);
  });
  thead.append(headRow);
  search.addEventListener("input", () => { shown = PAGE; render(); });
  more.addEventListener("click", () => { shown += PAGE; render(); });

  const missing = (v) => v === null || v === undefined;
  function ordered(a, b, dir) { // missing values last in either direction
    if (missing(a) || missing(b)) return missing(a) === missing(b) ? 0 : missing(a) ? 1 : -1;
    return a === b ? 0 : (a < b ? -1 : 1) * dir;
  }
  function matches(item, needle) {
    if (!needle) return true;
    const hay = [item.id, item.image_id || "", ...item.rows.map((r) => r.caption), ...flagsOf(item)].join("\n").toLowerCase();
    return needle.split(/\s+/).every((word) => hay.includes(word));
  }

  function render() {
    const needle = search.value.trim().toLowerCase();
    const rows = data.items.filter((it) => matches(it, needle));
    rows.sort((x, y) => ordered(sort.get(x), sort.get(y), sort.dir)); // stable: input order on ties
    tbody.replaceChildren();
    for (const item of rows.slice(0, shown)) {
      const tr = el("tr", { class: "item" + (open.has(item.id) ? " open" : ""), "data-id": item.id });
      columns.forEach((c) => tr.append(c.cell(item)));
      tr.addEventListener("click", () => { open.has(item.id) ? open.delete(item.id) : open.add(item.id); render(); });
      tbody.append(tr);
      if (open.has(item.id)) tbody.append(el("tr", { class: "detail" }, el("td", { colspan: String(columns.length) }, detail(item))));
    }
    count.textContent = `showing ${Math.min(shown, rows.length)} of ${rows.length} (${data.items.length} in all)`;
    more.hidden = rows.length <= shown;
    thead.querySelectorAll("th").forEach((th, i) => {
      th.className = sort.column === i ? (sort.dir > 0 ? "sorted-asc" : "sorted-desc") : "";
    });
    buttons.querySelectorAll("button").forEach((b) => b.classList.toggle("active", b.id === "order-" + sort.button));
  }

  function detail(item) {
    const box = el("div", { class: "detail detail-systems" });
    item.rows.forEach((row, k) => box.append(systemDetail(row, systems[k], compare ? (k === 0 ? "A: " : "B: ") : "")));
    return box;
  }

  function systemDetail(row, system, prefix) {
    const box = el("div");
    box.append(el("h3", { text: `${prefix}${system.name}: ${system.score_key} ${fmt(row.score)}` }));
    box.append(el("p", {}, el("b", { text: "caption: " }), row.caption || el("span", { class: "muted", text: "(caption text not in the score file; pass --input)" })));
    if (system.components.length) {
      box.append(el("p", { text: system.components.map((c, j) => `${c} ${fmt(row.parts[j])}`).join(" · ") }));
    }
    if (row.flags.length) box.append(el("p", {}, el("b", { text: "flags: " }), ...row.flags.map((f) => el("span", { class: "flag", text: f }))));
    if (row.questions) box.append(questionTable(row));
    else if (system.score_key === "qace") box.append(el("p", { class: "muted", text: "No per-question evidence: score with qace score --explain to see each question and its answers." }));
    if (row.context !== undefined) box.append(el("h3", { text: "visual context" }), el("pre", { class: "text", text: row.context }));
    if (row.visce2_raw !== undefined) box.append(el("h3", { text: "rating answer" }), el("pre", { class: "text", text: row.visce2_raw }));
    if (row.original !== undefined || row.generated !== undefined) box.append(thumbs(row));
    return box;
  }

  function questionTable(row) {
    const wrap = el("div");
    if (row.candidates && row.candidates.length) wrap.append(el("p", {}, el("b", { text: "answer candidates: " }), row.candidates.join(", ")));
    const k = Math.max(0, ...row.questions.map((q) => q.answers.length));
    const names = Array.from({ length: k }, (_, j) => (row.contexts[j] === "image" ? "image" : `reference ${j + 1}`));
    const table = el("table", { class: "questions" });
    const head = el("tr", {}, el("th", { text: "candidate" }), el("th", { text: "question" }), el("th", { text: "answer on caption" }));
    names.forEach((n, j) => head.append(el("th", { text: `answer on ${n}`, title: row.contexts[j] || "" })));
    table.append(head);
    for (const q of row.questions) {
      const tr = el("tr", {}, el("td", { text: q.candidate ?? "" }), el("td", { text: q.question ?? "" }), el("td", { text: q.own ?? "" }));
      for (let j = 0; j < k; j++) {
        tr.append(el("td", {}, el("div", { text: q.answers[j] ?? "" }),
          el("div", { class: "values", text: `F1 ${fmt(q.f1[j], 2)} · BS ${fmt(q.bs[j], 2)} · AN ${fmt(q.an[j], 2)}` })));
      }
      table.append(tr);
    }
    wrap.append(table);
    const refs = row.contexts.filter((c) => c !== "image");
    if (refs.length) wrap.append(el("ol", { class: "refs" }, ...refs.map((r) => el("li", { text: r }))));
    return wrap;
  }

  function thumbs(row) {
    const box = el("div", { class: "thumbs" });
    const figure = (path, label) => {
      const src = data.images[path];
      return el("figure", {}, src ? el("img", { src, alt: label }) : el("div", { class: "muted", text: "image unreadable: " + path }), el("figcaption", { text: label }));
    };
    if (row.original !== undefined) box.append(figure(row.original, "original"));
    (row.generated || []).forEach((p, s) => box.append(figure(p, `generated ${s + 1}` + (row.samples ? ` (cos ${fmt(row.samples[s])})` : ""))));
    return box;
  }

  render();
})();
