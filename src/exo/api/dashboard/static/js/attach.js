// Images for the next chat message: pasted into the prompt or dropped on the composer, shown
// as thumbnails (each with a remove button), sent as OpenAI image_url parts holding data URLs.
// Only a model whose card says vision takes them; for any other the page says so and keeps none.

import { bytes, h, replace } from "./dom.js";

const TYPES = ["image/png", "image/jpeg", "image/webp", "image/gif"]; // what the API decodes
const MAX_BYTES = 20 * 1024 * 1024; // the API's limit for one image

/** `model()`: the chosen model's id; `takesImages()`: whether its card says vision. */
export function createAttachments({ model, takesImages }) {
  let images = []; // [{ name, url }]
  const tray = h("div", { id: "attachments", class: "attachments" });
  const notice = h("div", { id: "attach-notice", class: "error attach-notice", hidden: true });

  function say(message) {
    notice.textContent = message;
    notice.hidden = !message;
  }

  function render() {
    replace(tray, images.map((image, i) => h("figure", { class: "thumb" },
      h("img", { src: image.url, alt: image.name, title: image.name }),
      h("button", {
        type: "button", class: "link remove", title: "remove this image",
        onclick: () => { images = images.filter((_, j) => j !== i); render(); },
      }, "×"))));
  }

  function refusal(file) {
    if (!TYPES.includes(file.type)) return `${file.name || "that file"} is not a PNG, JPEG, WebP or GIF image`;
    if (file.size > MAX_BYTES) return `${file.name || "the image"} is too large (${bytes(file.size)}; at most ${bytes(MAX_BYTES)})`;
    return null;
  }

  async function add(files) {
    if (!takesImages()) {
      say(`${model() || "this model"} does not take images: pick a vision model to send one`);
      return;
    }
    const problems = [];
    for (const file of files) {
      const problem = refusal(file);
      if (problem) problems.push(problem);
      else images.push({ name: file.name || "pasted image", url: await dataUrl(file) });
    }
    say(problems.join("; "));
    render();
  }

  /** Paste into `input`, drop onto `zone`: image files become attachments. */
  function listen(input, zone) {
    input.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files ?? [])];
      if (!files.length) return; // plain text pastes as usual
      event.preventDefault();
      add(files);
    });
    zone.addEventListener("dragover", (event) => {
      if (![...(event.dataTransfer?.types ?? [])].includes("Files")) return;
      event.preventDefault();
      zone.classList.add("dropping");
    });
    zone.addEventListener("dragleave", () => zone.classList.remove("dropping"));
    zone.addEventListener("drop", (event) => {
      zone.classList.remove("dropping");
      const files = [...(event.dataTransfer?.files ?? [])];
      if (!files.length) return;
      event.preventDefault();
      add(files);
    });
  }

  /** The chosen model changed: a model without vision drops what was attached, saying why. */
  function modelChanged() {
    if (images.length && !takesImages()) {
      images = [];
      render();
      say(`${model()} does not take images: the attached images were removed`);
    } else {
      say("");
    }
  }

  /** The attached images' data URLs, and none attached after. */
  function take() {
    const urls = images.map((image) => image.url);
    images = [];
    render();
    say("");
    return urls;
  }

  return { tray, notice, listen, modelChanged, take, takesImages, count: () => images.length };
}

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/** A user message's content: its text, or text and image_url parts when it has images. */
export function messageContent(text, images) {
  if (!images?.length) return text;
  return [
    ...(text ? [{ type: "text", text }] : []),
    ...images.map((url) => ({ type: "image_url", image_url: { url } })),
  ];
}

/** Thumbnails of a sent message's images. */
export function sentImages(images) {
  if (!images?.length) return null;
  return h("div", { class: "sent-images" }, images.map((url) => h("img", { src: url, alt: "image" })));
}
