// kvlink-rag playground: helpers shared by the page's scripts, and the documents panel (ingest from the
// form or files, the list with live status, edit, delete). Loaded after api.js, before app.js.
"use strict";

const $ = (id) => document.getElementById(id);
const items = new Map(); // document id -> its li.doc
let editing = null;      // id of the document the form updates (PUT), else null (POST)
let listSeq = 0;         // only the newest list request is rendered
let pollTimer = null;
let errorSource = null;  // "list" when #error comes from polling (cleared by the next good poll)

function make(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function textOf(e) {
  // the API names fields by their place in the request ("body.question: ..."); the page shows the field alone
  return e instanceof kvApi.ApiFailure ? e.message.replace(/\bbody\./g, "")
    : "unexpected error in the page: " + (e && e.message || e);
}

function showError(message, source) {
  $("error").textContent = message;
  $("error").hidden = false;
  errorSource = source || null;
  if (source !== "list") $("error").scrollIntoView({ block: "nearest" }); // on a phone it may be off-screen
}

function clearError(source) {
  if (source && errorSource !== source) return;
  $("error").textContent = "";
  $("error").hidden = true;
  errorSource = null;
  for (const id of ["answer", "answer-full"]) if ($(id).dataset.state === "error") $(id).dataset.state = "idle";
}

let messageTimer = null;
function showMessage(text) {  // the last ingest outcome; fades after a while (the list shows the status)
  clearTimeout(messageTimer);
  $("doc-message").textContent = text;
  messageTimer = setTimeout(() => { $("doc-message").textContent = ""; }, 10000);
}

// -- documents ------------------------------------------------------------------------------------

const docPath = (id) => "/v1/documents/" + encodeURIComponent(id);

async function refreshDocs() {
  clearTimeout(pollTimer);
  const seq = ++listSeq;
  let pending = false;
  try {
    const page = await kvApi.request("GET", "/v1/documents?limit=1000");
    if (seq !== listSeq) return; // a newer refresh is on its way and schedules the next poll
    renderDocs(page.documents);
    pending = page.documents.some((d) => d.status === "queued" || d.status === "stale");
    clearError("list");
  } catch (e) {
    if (seq !== listSeq) return;
    showError(textOf(e), "list");
  }
  pollTimer = setTimeout(refreshDocs, pending ? 1000 : 5000);
}

function renderDocs(docs) {
  const list = $("doc-list");
  $("doc-empty").hidden = docs.length > 0;
  const ids = new Set(docs.map((d) => d.id));
  for (const [id, li] of items) {
    if (!ids.has(id)) { li.remove(); items.delete(id); }
  }
  docs.forEach((doc, i) => {
    let li = items.get(doc.id);
    if (!li) { li = docItem(doc.id); items.set(doc.id, li); }
    updateItem(li, doc);
    if (list.children[i] !== li) list.insertBefore(li, list.children[i] || null);
  });
}

function docItem(id) {
  const li = make("li", "doc");
  li.dataset.docId = id;
  const pick = make("label", "doc-pick");
  const box = make("input", "doc-select");
  box.type = "checkbox";
  pick.append(box, make("span", "doc-title"));
  const edit = make("button", "doc-edit", "Edit");
  const del = make("button", "doc-delete", "Delete");
  edit.type = del.type = "button";
  edit.title = "Edit " + id;
  del.title = "Delete " + id;
  const actions = make("span", "doc-actions");
  actions.append(edit, del);
  const idText = make("span", "doc-id", id);
  idText.title = id;  // long ids are cut with an ellipsis
  li.append(pick, idText, make("span", "doc-status"), actions, make("span", "doc-error"));
  return li;
}

function updateItem(li, doc) {
  li.querySelector(".doc-title").textContent = doc.title || doc.id;
  const status = li.querySelector(".doc-status");
  status.textContent = doc.status;
  status.className = "doc-status status-" + doc.status;
  const failed = doc.status === "failed";
  li.querySelector(".doc-error").textContent = failed ? (doc.metadata && doc.metadata.error) || "precompute failed" : "";
}

function describeIngest(outs, verb) {
  const lines = outs.length > 3 ? [`${verb} ${outs.length} documents`]
    : outs.map((o) => (o.queued ? `${verb} ${o.id} (${o.status})` : `${o.id} unchanged (${o.status})`));
  for (const o of outs) {
    for (const d of o.near_duplicates || []) lines.push(`${o.id}: near duplicate of ${d.id} (distance ${d.distance})`);
  }
  return lines.join("\n");
}

async function submitDoc(ev) {
  ev.preventDefault();
  clearError();
  const text = $("doc-text").value, title = $("doc-title").value.trim(), id = $("doc-id").value.trim();
  try {
    if (editing) {
      showMessage(describeIngest([await kvApi.request("PUT", docPath(editing), { text, title })], "updated"));
    } else {
      const body = id ? { id, text, title } : { text, title };
      showMessage(describeIngest([await kvApi.request("POST", "/v1/documents", body)], "added"));
    }
    resetForm();
  } catch (e) {
    $("doc-message").textContent = "";
    showError(textOf(e));
  }
  refreshDocs();
}

function jsonlDocuments(name, content) {
  const stem = name.replace(/\.[^.]*$/, "");
  const docs = [];
  content.split(/\r?\n/).forEach((line, i) => {
    if (!line.trim()) return;
    let row;
    try { row = JSON.parse(line); } catch (e) { throw new kvApi.ApiFailure(`${name} line ${i + 1} is not JSON`); }
    if (!row || typeof row.text !== "string") throw new kvApi.ApiFailure(`${name} line ${i + 1} has no "text" string`);
    const doc = { id: row.id != null ? String(row.id) : `${stem}-${i + 1}`, text: row.text, title: String(row.title || "") };
    if (row.metadata && typeof row.metadata === "object") doc.metadata = row.metadata;
    docs.push(doc);
  });
  return docs;
}

async function uploadFiles() {
  const files = Array.from($("doc-file").files);
  if (!files.length) return;
  clearError();
  try {
    const docs = [];
    for (const f of files) {
      const content = await f.text();
      if (/\.jsonl$/i.test(f.name)) docs.push(...jsonlDocuments(f.name, content));
      else docs.push({ id: f.name, title: f.name.replace(/\.[^.]*$/, ""), text: content });
    }
    if (!docs.length) throw new kvApi.ApiFailure("no documents in the chosen files");
    const out = await kvApi.request("POST", "/v1/documents", { documents: docs });
    showMessage(describeIngest(out.documents, "added"));
  } catch (e) {
    $("doc-message").textContent = "";
    showError(textOf(e));
  }
  $("doc-file").value = "";
  refreshDocs();
}

async function editDoc(id) {
  clearError();
  try {
    const doc = await kvApi.request("GET", docPath(id) + "?include_text=true");
    editing = id;
    $("doc-id").value = id;
    $("doc-id").readOnly = true;
    $("doc-title").value = doc.title || "";
    $("doc-text").value = doc.text || "";
    $("doc-add").textContent = "Update";
    $("doc-cancel").hidden = false;
    $("doc-text").focus();
  } catch (e) {
    $("doc-message").textContent = "";
    showError(textOf(e));
  }
}

function resetForm() {
  editing = null;
  for (const id of ["doc-id", "doc-title", "doc-text"]) $(id).value = "";
  $("doc-id").readOnly = false;
  $("doc-add").textContent = "Add";
  $("doc-cancel").hidden = true;
}

async function deleteDoc(id) {
  clearError();
  try {
    await kvApi.request("DELETE", docPath(id));
    const li = items.get(id);
    if (li) li.remove();
    items.delete(id);
    if (editing === id) resetForm();
    showMessage("deleted " + id);
  } catch (e) {
    $("doc-message").textContent = "";
    showError(textOf(e));
  }
  refreshDocs();
}

function onListClick(ev) {
  const button = ev.target.closest("button");
  const li = button && button.closest("li.doc");
  if (!li) return;
  if (button.classList.contains("doc-edit")) editDoc(li.dataset.docId);
  else if (button.classList.contains("doc-delete")) deleteDoc(li.dataset.docId);
}
