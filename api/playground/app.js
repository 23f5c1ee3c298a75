// kvlink-rag playground: questions (streamed answers, compare with full prefill, documents used, timings),
// settings (API key, adapter) and start. Loaded after api.js and documents.js.
"use strict";

const TIMINGS = ["retrieval_s", "queue_wait_s", "cache_load_s", "link_s", "ttft_s", "total_s"];
let asking = false;

// -- questions ------------------------------------------------------------------------------------

function ms(seconds) {
  const v = seconds * 1000;
  return (v < 10 ? v.toFixed(1) : String(Math.round(v))) + " ms";
}

function resetAnswers() {
  for (const id of ["answer", "answer-full"]) {
    $(id).textContent = "";
    $(id).dataset.state = "idle";
    $(id).dataset.chunks = "0";
  }
  $("full-box").hidden = !$("compare").checked;
  $("ttft-compare").textContent = "";
  $("used-docs").replaceChildren();
  $("used-method").textContent = "";
  for (const key of TIMINGS) document.querySelector(`[data-timing="${key}"]`).textContent = "-";
}

// Stream one answer into el (data-state, data-chunks); the done body, or null after showing the error.
async function answerInto(el, body) {
  let chunks = 0;
  el.dataset.state = "streaming";
  try {
    const done = await kvApi.streamQuery(body, (piece) => {
      el.textContent += piece;
      el.dataset.chunks = String(++chunks);
    });
    if (!chunks) el.textContent = done.answer; // else keep the streamed text (it only ever grows)
    if (done.finish_reason === "length") {  // stopped by max_new_tokens or the model's context, not by the model
      el.append(make("span", "cut", " [cut off at the token limit]"));
    }
    el.dataset.state = "done";
    return done;
  } catch (e) {
    el.dataset.state = "error";
    showError(textOf(e));
    return null;
  }
}

// Documents used, in prompt order; when explained, each one's attribution share as a bar and percentage
// (data-share) and its top passages quoted from the document's text (read once per answer).
function showUsed(docs, method) {
  const explained = docs.some((d) => d.attribution != null);
  const order = docs;
  $("used-method").textContent = explained ? `attribution: ${method === "leave_one_out"
    ? "share of the answer's log-likelihood lost when the document is left out" : "share of the attention"}` : "";
  $("used-docs").replaceChildren(...order.map((d) => {
    const li = make("li", "used");
    li.dataset.docId = d.id;
    const bar = make("span", "bar");
    const fill = make("span", "bar-fill");
    fill.style.width = (explained ? 100 * d.attribution : 0) + "%";
    bar.append(fill);
    if (!explained) bar.style.visibility = "hidden";
    bar.setAttribute("aria-hidden", "true");
    const share = make("span", "score", explained ? Math.round(100 * d.attribution) + "%" : "");
    if (explained) share.dataset.share = String(d.attribution);
    li.append(make("span", "cache " + (d.cache_hit ? "hit" : "miss"), d.cache_hit ? "hit" : "miss"),
              make("span", "used-title", d.title || d.id), bar, share);
    if (explained && d.passages && d.passages.length) {
      const quotes = make("ol", "passages");
      li.append(quotes);
      showPassages(quotes, d.id, d.passages);
    }
    return li;
  }));
}

async function showPassages(list, id, passages) {
  try {
    const doc = await kvApi.request("GET", docPath(id) + "?include_text=true");
    list.replaceChildren(...passages.map((p) => make("li", "passage", `\u201c${doc.text.slice(p.start, p.end).trim()}\u201d`)));
  } catch (e) {
    list.remove();  // the document went away since the answer: no passages to quote
  }
}

function showTimings(timings) {
  for (const key of TIMINGS) document.querySelector(`[data-timing="${key}"]`).textContent = ms(timings[key]);
}

let tickCount = 0;  // documents are placed in the prompt in the order they were ticked

function onTick(ev) {
  if (!ev.target.classList.contains("doc-select")) return;
  ev.target.dataset.tick = ev.target.checked ? String(++tickCount) : "";
}

function queryBody() {
  const body = { question: $("question").value.trim() };
  const ticked = Array.from(document.querySelectorAll("#doc-list .doc-select:checked"));
  ticked.sort((a, b) => Number(a.dataset.tick || 0) - Number(b.dataset.tick || 0));
  const ids = ticked.map((b) => b.closest("li.doc").dataset.docId);
  if (ids.length) body.document_ids = ids;
  else if ($("top-k").value !== "") body.top_k = Number($("top-k").value);
  if ($("adapter").value && $("adapter").value !== "default") body.adapter = $("adapter").value;
  if ($("explain").checked) body.explain = true;  // the server's attribution method (KVLINK_RAG_ATTRIBUTION)
  return body;
}

async function ask(ev) {
  if (ev) ev.preventDefault();
  if (asking) return;
  asking = true;
  $("ask").disabled = true;
  clearError();
  resetAnswers();
  try {
    const body = queryBody();
    if (!body.question) {
      $("question").focus({ preventScroll: true });
      showError("type a question first");  // scrolls the message into view
      return;
    }
    const linked = await answerInto($("answer"), body);
    if (!linked) return;
    showUsed(linked.documents, linked.attribution_method);
    showTimings(linked.timings);
    if (!$("compare").checked) return;
    $("full-box").hidden = false; // after the linked answer, never beside it: the model is shared
    // the same request in mode full: the same documents (or retrieved chunks), every prompt token computed cold;
    // explain is for linked answers
    const full = await answerInto($("answer-full"), { ...body, mode: "full", explain: undefined });
    if (!full) return;
    const a = linked.timings.ttft_s, b = full.timings.ttft_s;
    // full is cold unless the server sets KVLINK_RAG_FULL_MODE_CACHED: then say what it read from the prefix tree
    const reused = full.cached_tokens ? `; full read ${full.cached_tokens} of ${full.context_tokens} prompt tokens from the prefix tree (not a cold prefill)` : "";
    $("ttft-compare").textContent = `TTFT linked ${ms(a)} (${linked.cached_tokens} of ${linked.context_tokens} prompt tokens cached) vs full ${full.cached_tokens ? "" : "cold "}${ms(b)}` + (a > 0 ? ` (${(b / a).toFixed(1)}x)` : "") + reused;
  } finally {
    asking = false;
    $("ask").disabled = false;
  }
}

// -- settings and start ---------------------------------------------------------------------------

async function loadAdapters() {
  const select = $("adapter");
  try {
    const out = await kvApi.request("GET", "/v1/adapters");
    const names = ["default", ...out.adapters.filter((n) => n !== "default")];
    const current = select.value;
    select.replaceChildren(...names.map((n) => new Option(n, n)));
    select.value = names.includes(current) ? current : "default";
  } catch (e) {
    // keep "default": a missing API key already shows as the list's error
  }
}

let keyTimer = null;
function onKeyInput() {
  clearTimeout(keyTimer);
  keyTimer = setTimeout(() => { refreshDocs(); loadAdapters(); }, 400);
}

function start() {
  $("doc-form").addEventListener("submit", submitDoc);
  $("doc-cancel").addEventListener("click", resetForm);
  $("doc-file").addEventListener("change", uploadFiles);
  $("doc-list").addEventListener("click", onListClick);
  $("doc-list").addEventListener("change", onTick);
  $("ask-form").addEventListener("submit", ask);
  $("compare").addEventListener("change", () => { $("full-box").hidden = !$("compare").checked; });
  $("api-key").addEventListener("input", onKeyInput);
  refreshDocs();
  loadAdapters();
}

start();
