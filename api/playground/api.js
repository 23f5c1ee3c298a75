// kvlink-rag playground: talking to the API (requests, readable errors, server-sent events).
"use strict";

const kvApi = (() => {
  const NETWORK = "cannot reach the server";

  // An API failure whose message is meant for people (never raw JSON).
  class ApiFailure extends Error {}

  function headers(json) {
    const h = {};
    const key = document.getElementById("api-key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    if (json) h["Content-Type"] = "application/json";
    return h;
  }

  // The text of an error body {"error": {"message"}}, else a short line naming the status.
  function messageOf(body, status) {
    if (body && body.error && typeof body.error.message === "string") return body.error.message;
    if (body && typeof body.detail === "string") return body.detail;
    return status ? "the server answered HTTP " + status : "the server answered with an error";
  }

  async function errorText(resp) {
    let body = null;
    try { body = JSON.parse(await resp.text()); } catch (e) { body = null; }
    return messageOf(body, resp.status);
  }

  // fetch with the API key; resolves to the Response when it is 2xx, else throws ApiFailure.
  async function send(method, path, body) {
    let resp;
    try {
      resp = await fetch(path, { method, headers: headers(body !== undefined),
                                 body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      throw new ApiFailure(NETWORK);
    }
    if (!resp.ok) throw new ApiFailure(await errorText(resp));
    return resp;
  }

  // The JSON answer of a request (throws ApiFailure with a readable message).
  async function request(method, path, body) {
    const resp = await send(method, path, body);
    try { return await resp.json(); } catch (e) { throw new ApiFailure("the server sent an unreadable answer"); }
  }

  // One SSE block ("event: x\ndata: y" lines) as {event, data}; null for comment-only blocks.
  function parseBlock(block) {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    return data.length ? { event, data: data.join("\n") } : null;
  }

  // Server-sent events of a fetch Response, as they arrive (CRLF, CR or LF line ends; comments skipped).
  async function* sseEvents(resp) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      buf += decoder.decode(value || new Uint8Array(), { stream: !done });
      // a trailing CR may be the first half of a CRLF split across chunks: keep it until more arrives
      buf = done ? buf.replace(/\r\n?/g, "\n") : buf.replace(/\r\n|\r(?!$)/g, "\n");
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const ev = parseBlock(buf.slice(0, end));
        buf = buf.slice(end + 2);
        if (ev) yield ev;
      }
      if (done) {
        const ev = parseBlock(buf);
        if (ev) yield ev;
        return;
      }
    }
  }

  // POST /v1/query with stream: true; onToken(text) per piece; resolves to the done body.
  // Throws ApiFailure for HTTP errors, an error event, a dropped connection or a stream without done.
  async function streamQuery(body, onToken) {
    const resp = await send("POST", "/v1/query", { ...body, stream: true });
    let done = null;
    try {
      for await (const ev of sseEvents(resp)) {
        if (ev.event === "token") onToken(JSON.parse(ev.data).text);
        else if (ev.event === "done") done = JSON.parse(ev.data);
        else if (ev.event === "error") throw new ApiFailure(messageOf(JSON.parse(ev.data)));
      }
    } catch (e) {
      throw e instanceof ApiFailure ? e : new ApiFailure(NETWORK);
    }
    if (!done) throw new ApiFailure("the answer stream ended before the answer was complete");
    return done;
  }

  return { ApiFailure, NETWORK, request, streamQuery, sseEvents };
})();
