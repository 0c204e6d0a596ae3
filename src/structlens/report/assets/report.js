// structlens report: sortable tables and the preimage browser. No network, no eval;
// every string from the data is inserted with textContent (never as HTML).
"use strict";

function sortTable(th) {
  const table = th.closest("table");
  const body = table.tBodies[0];
  const col = Array.prototype.indexOf.call(th.parentNode.children, th);
  const asc = th.getAttribute("aria-sort") !== "ascending";
  table.querySelectorAll("th").forEach((h) => h.removeAttribute("aria-sort"));
  th.setAttribute("aria-sort", asc ? "ascending" : "descending");
  const key = (row) => {
    const cell = row.children[col];
    const v = cell.getAttribute("data-v");
    if (v !== null && v !== "" && !isNaN(Number(v))) return Number(v);
    return cell.textContent.trim().toLowerCase();
  };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return asc ? c : -c;
  });
  rows.forEach((r) => body.appendChild(r));
}

function contextNode(entry, extra) {
  const li = document.createElement("li");
  const code = document.createElement("span");
  code.className = "ctx";
  code.appendChild(document.createTextNode(entry.context[0]));
  const mark = document.createElement("mark");
  mark.textContent = entry.context[1];
  code.appendChild(mark);
  code.appendChild(document.createTextNode(entry.context[2]));
  li.appendChild(code);
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = " " + entry.prompt + " @" + entry.position + (extra ? " " + extra : "");
  li.appendChild(meta);
  return li;
}

function setupBrowser() {
  const holder = document.getElementById("preimage-data");
  if (!holder) return;
  const data = JSON.parse(holder.textContent);
  const select = document.getElementById("preimage-subspace");
  const tops = document.getElementById("preimage-top");
  const search = document.getElementById("preimage-search");
  const results = document.getElementById("preimage-results");
  const query = document.getElementById("preimage-query");
  const near = document.getElementById("preimage-neighbours");
  data.partition.forEach((dim, s) => {
    const opt = document.createElement("option");
    opt.value = String(s);
    opt.textContent = "subspace " + s + " (" + dim + " dims)";
    select.appendChild(opt);
  });
  const text = (e) => (e.context[0] + e.context[1] + e.context[2]).toLowerCase();

  function showTop() {
    tops.replaceChildren();
    data.top[Number(select.value)].forEach((i) => tops.appendChild(contextNode(data.entries[i])));
  }

  function showNeighbours(i) {
    near.replaceChildren();
    const s = Number(select.value);
    const head = document.createElement("li");
    head.className = "query";
    head.appendChild(contextNode(data.entries[i], "(query)"));
    near.appendChild(head);
    data.neighbours[s][i].forEach(([j, sim]) => {
      if (j >= 0) near.appendChild(contextNode(data.entries[j], "cos " + sim.toFixed(3)));
    });
  }

  function runSearch() {
    results.replaceChildren();
    const q = search.value.trim().toLowerCase();
    if (!q) return;
    let n = 0;
    data.entries.forEach((e, i) => {
      if (n >= 50) return;
      if (e.context[1].trim().toLowerCase() === q || text(e).includes(q)) {
        const li = contextNode(e);
        const btn = document.createElement("button");
        btn.type = "button";
        btn.textContent = "nearest";
        btn.addEventListener("click", () => showNeighbours(i));
        li.appendChild(btn);
        results.appendChild(li);
        n += 1;
      }
    });
    if (n === 0) {
      const li = document.createElement("li");
      li.textContent = "no stored context matches";
      results.appendChild(li);
    }
  }

  function runQuery() {
    const q = query.value.trim().toLowerCase();
    if (!q) return;
    const i = data.entries.findIndex((e) => text(e).includes(q));
    near.replaceChildren();
    if (i < 0) {
      const li = document.createElement("li");
      li.textContent = "no stored context contains this text";
      near.appendChild(li);
      return;
    }
    showNeighbours(i);
  }

  select.addEventListener("change", () => {
    showTop();
    near.replaceChildren();
  });
  search.addEventListener("input", runSearch);
  document.getElementById("preimage-query-go").addEventListener("click", runQuery);
  query.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") runQuery();
  });
  showTop();
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("table.sortable th").forEach((th) => {
    th.addEventListener("click", () => sortTable(th));
  });
  setupBrowser();
});
