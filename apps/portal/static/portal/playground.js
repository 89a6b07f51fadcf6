// The playground: a chat whose answers stream in over the WebSocket at /ws/playground
// (apps/portal/consumers.py). The socket speaks JSON: {"type": "chat", ...} goes out; "delta",
// "done" and "error" messages come back.
(() => {
  "use strict";

  const byId = (id) => document.getElementById(id);
  const keySelect = byId("pg-key");
  const modelSelect = byId("pg-model");
  const modelHelp = byId("pg-model-help");
  const systemInput = byId("pg-system");
  const temperatureInput = byId("pg-temperature");
  const maxTokensInput = byId("pg-max-tokens");
  const chat = byId("pg-chat");
  const composer = byId("pg-composer");
  const messageInput = byId("pg-message");
  const sendButton = byId("pg-send");
  const clearButton = byId("pg-clear");
  const connection = byId("pg-connection");
  const keyModels = JSON.parse(byId("pg-key-models").textContent);

  const history = []; // the conversation so far, as the API takes it
  let answer = null; // the answer streaming in: {element, text, deltas}
  let socket = null;
  let waiting = null; // a message to send once the socket opens

  // --- the key's models ---------------------------------------------------------------

  function offerModels() {
    const allowed = keyModels[keySelect.value] || [];
    let firstAllowed = null;
    for (const option of modelSelect.options) {
      const usable = allowed.length === 0 || allowed.includes(option.value);
      option.disabled = option.hidden = !usable;
      if (usable && firstAllowed === null) firstAllowed = option;
    }
    const selected = modelSelect.selectedOptions[0];
    if (!selected || selected.disabled) modelSelect.value = firstAllowed ? firstAllowed.value : "";
    describeModel();
  }

  function describeModel() {
    const option = modelSelect.selectedOptions[0];
    if (!option || option.disabled) {
      modelHelp.textContent = "This key may use none of the active models.";
    } else {
      modelHelp.textContent = `Context: ${Number(option.dataset.context).toLocaleString()} tokens (prompt and answer).`;
      maxTokensInput.max = option.dataset.context;
    }
    setIdle();
  }

  // --- the socket ---------------------------------------------------------------------

  function showConnection(state, text) {
    connection.dataset.state = state;
    connection.textContent = text;
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/playground`);
    showConnection("connecting", "Connecting…");
    socket.addEventListener("open", () => {
      showConnection("open", "Connected");
      if (waiting !== null) {
        socket.send(waiting);
        waiting = null;
      }
    });
    socket.addEventListener("close", () => {
      socket = null;
      showConnection("closed", "Disconnected: sending a message reconnects");
      if (answer) fail({ message: "The connection closed before the answer was complete." });
    });
    socket.addEventListener("message", (event) => receive(JSON.parse(event.data)));
  }

  function send(message) {
    const text = JSON.stringify(message);
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(text);
      return;
    }
    waiting = text;
    if (!socket) connect();
  }

  // --- the chat -----------------------------------------------------------------------

  // The chat grows with the page; what is being written and the message box stay on screen.
  function keepInView() {
    composer.scrollIntoView({ block: "nearest" });
  }

  function addMessage(role, content) {
    byId("pg-empty")?.remove();
    const element = document.createElement("div");
    element.className = `msg ${role}`;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : modelSelect.value;
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = content;
    element.append(who, text);
    chat.append(element);
    keepInView();
    return { element, text, deltas: 0 };
  }

  function setIdle() {
    sendButton.disabled = answer !== null || !modelSelect.value;
    clearButton.disabled = answer !== null;
  }

  function stat(parent, className, label, value) {
    const span = document.createElement("span");
    span.className = className;
    span.append(`${label} `);
    const strong = document.createElement(className === "request-id" ? "code" : "strong");
    strong.textContent = value;
    span.append(strong);
    parent.append(span);
  }

  function finish(done) {
    answer.element.dataset.state = "done";
    history.push({ role: "assistant", content: answer.text.textContent });
    const stats = document.createElement("div");
    stats.className = "stats";
    stat(stats, "request-id", "Request", done.request_id);
    if (done.usage) {
      stat(stats, "usage", "Tokens", `${done.usage.prompt_tokens} prompt + ${done.usage.completion_tokens} answer`);
    }
    if (done.ttft_ms !== null) stat(stats, "ttft", "First token in", `${Math.round(done.ttft_ms)} ms`);
    if (done.finish_reason && done.finish_reason !== "stop") stat(stats, "finish", "Stopped by", done.finish_reason);
    answer.element.append(stats);
    answer = null;
    setIdle();
  }

  function fail(error) {
    answer.element.dataset.state = "error";
    answer.element.classList.add("failed");
    const note = document.createElement("span");
    note.className = "error";
    note.setAttribute("role", "alert");
    note.textContent = error.code ? `${error.message} (${error.code})` : error.message;
    answer.element.append(note);
    // A refused question stays on screen but leaves the conversation, so the next one can pass.
    if (answer.text.textContent === "") history.pop();
    else history.push({ role: "assistant", content: answer.text.textContent });
    answer = null;
    setIdle();
  }

  function receive(message) {
    if (message.type === "delta" && answer) {
      answer.text.textContent += message.content;
      answer.deltas += 1;
      answer.element.dataset.deltas = String(answer.deltas);
      keepInView();
    } else if (message.type === "done" && answer) {
      finish(message);
    } else if (message.type === "error") {
      if (answer) fail(message.error);
      else showConnection("open", `Refused: ${message.error.message}`);
    }
  }

  function ask() {
    const content = messageInput.value.trim();
    if (!content || answer || !modelSelect.value) return;
    history.push({ role: "user", content });
    addMessage("user", content);
    answer = addMessage("assistant", "");
    answer.element.dataset.state = "streaming";
    messageInput.value = "";
    setIdle();
    const system = systemInput.value.trim();
    const request = {
      type: "chat",
      key_id: keySelect.value,
      model: modelSelect.value,
      messages: system ? [{ role: "system", content: system }, ...history] : [...history],
    };
    // Empty fields are left to the API's defaults; anything else goes as typed, for the
    // pipeline to judge as it judges an API call.
    if (temperatureInput.value !== "") request.temperature = Number(temperatureInput.value);
    if (maxTokensInput.value !== "") request.max_tokens = Number(maxTokensInput.value);
    send(request);
  }

  composer.addEventListener("submit", (event) => {
    event.preventDefault();
    ask();
  });
  messageInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ask();
    }
  });
  clearButton.addEventListener("click", () => {
    history.length = 0;
    chat.replaceChildren();
    messageInput.focus();
  });
  keySelect.addEventListener("change", offerModels);
  modelSelect.addEventListener("change", describeModel);

  offerModels();
  connect();
})();
