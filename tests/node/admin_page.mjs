// The satellite's admin page (/admin) in a real browser: the system Chromium, driven headless by playwright-core
// (which downloads no browser). Used by tests/python/test_admin_page.py, which holds the assertions.
//
//   node tests/node/admin_page.mjs <base_url> <token> <artifact_dir>
//
// Signs in with <token> at desktop width (1280x900) and at phone width (390x844, touch), waits for the page to
// say it has loaded (body[data-loaded]), and reads what it shows: every [data-figure] element's raw value, each
// chart's bars, each table's rows; saves desktop.png and phone.png (full page) in <artifact_dir>. Then signs in
// with a wrong token in a fresh context and reports whether the sign-in error appeared. Every console error, page
// error, failed request and HTTP response >= 400 the page caused is reported per run: the wrong-token run expects
// a 401, so its findings are kept apart from the good runs'. Prints one JSON object on stdout and exits 0; exits
// 2 (with the reason on stderr) only when the browser cannot be driven at all.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [base, token, artifacts] = process.argv.slice(2);
if (!base || !token || !artifacts) {
  console.error("usage: node tests/node/admin_page.mjs <base_url> <token> <artifact_dir>");
  process.exit(2);
}
const adminUrl = `${base.replace(/\/+$/, "")}/admin`;
const TIMEOUT = Number(process.env.ADMIN_PAGE_TIMEOUT_MS || 30000);

/** Records what went wrong on a page: console errors, uncaught errors, failed requests, responses >= 400. */
function watch(page) {
  const seen = { console_errors: [], page_errors: [], failed_requests: [], api_summaries: [] };
  const pending = [];
  page.on("console", (message) => {
    if (message.type() === "error") {
      const where = message.location();
      seen.console_errors.push({ text: message.text(), url: where && where.url ? where.url : null });
    }
  });
  page.on("pageerror", (error) => seen.page_errors.push(String(error && error.stack ? error.stack : error)));
  page.on("requestfailed", (request) => {
    const failure = request.failure();
    seen.failed_requests.push({ url: request.url(), method: request.method(), error: failure ? failure.errorText : "failed" });
  });
  page.on("response", (response) => {
    const url = response.url();
    if (response.status() >= 400) {
      seen.failed_requests.push({ url, method: response.request().method(), status: response.status() });
    } else if (new URL(url).pathname === "/api/analytics/summary") {
      // The summary the page itself was given, so a figure can be checked against exactly what the page read.
      pending.push(response.json().then((body) => seen.api_summaries.push(body), () => {}));
    }
  });
  return { seen, settle: () => Promise.all(pending) };
}

async function signIn(page, secret) {
  await page.goto(adminUrl, { waitUntil: "load", timeout: TIMEOUT });
  await page.locator("#token").fill(secret);
  await page.locator("form#sign-in button[type=submit]").click();
}

/** What the signed-in page shows. */
async function read(page) {
  return page.evaluate(() => {
    const text = (id) => (document.getElementById(id) || { textContent: null }).textContent;
    const figures = {};
    const figure_texts = {};
    for (const element of document.querySelectorAll("[data-figure]")) {
      figures[element.dataset.figure] = element.hasAttribute("data-value") ? element.dataset.value : null;
      figure_texts[element.dataset.figure] = element.textContent;
    }
    const bars = {};
    const bar_values = {};
    const bar_labels = {};
    for (const id of ["chart-savings", "chart-servers"]) {
      const rects = [...document.querySelectorAll(`#${id} rect.bar`)];
      bars[id] = rects.length;
      bar_values[id] = rects.map((r) => r.getAttribute("data-value"));
      bar_labels[id] = rects.map((r) => r.getAttribute("data-label"));
    }
    const rows = {};
    const tables = {};
    for (const id of ["users", "instances", "failures"]) {
      const trs = [...document.querySelectorAll(`#${id} tbody tr`)];
      // The "nothing yet" row is one cell spanning the table: no data.
      const data = trs.filter((tr) => !(tr.cells.length === 1 && tr.cells[0].colSpan > 1));
      rows[id] = data.length;
      tables[id] = data.map((tr) => [...tr.cells].map((td) => td.textContent));
    }
    const visible = (id) => {
      const element = document.getElementById(id);
      return Boolean(element && !element.hidden && element.getClientRects().length > 0);
    };
    return {
      loaded: document.body.dataset.loaded || null,
      dashboard_visible: visible("dashboard"),
      sign_in_visible: visible("sign-in"),
      scope: text("scope"),
      load_error: text("load-error"),
      sign_in_error: text("sign-in-error"),
      status_counts: text("status-counts"),
      figures,
      figure_texts,
      bars,
      bar_values,
      bar_labels,
      rows,
      tables,
    };
  });
}

/** Elements reaching past the right edge of the viewport (what makes a page scroll sideways). */
async function overflow(page) {
  return page.evaluate(() => {
    const width = window.innerWidth;
    const doc = document.documentElement;
    const wide = [];
    for (const element of document.querySelectorAll("body *")) {
      const box = element.getBoundingClientRect();
      if (box.width > 0 && box.right > width + 1) {
        // Content scrolled inside an overflow container does not widen the document.
        let inside = false;
        for (let up = element.parentElement; up && up !== document.body; up = up.parentElement) {
          const style = getComputedStyle(up);
          if (["auto", "scroll", "hidden", "clip"].includes(style.overflowX)) {
            inside = true;
            break;
          }
        }
        if (!inside) {
          const name = element.tagName.toLowerCase() + (element.id ? `#${element.id}` : "") +
            (element.classList.length ? `.${[...element.classList].join(".")}` : "");
          wide.push({ element: name, right: Math.round(box.right) });
        }
      }
    }
    return {
      scroll_width: doc.scrollWidth,
      inner_width: width,
      overflow_x: doc.scrollWidth > width + 1,
      too_wide: wide.slice(0, 20),
    };
  });
}

/** Signs in with the good token in a new context, reads the page, screenshots it. */
async function goodRun(browser, name, contextOptions) {
  const context = await browser.newContext(contextOptions);
  const page = await context.newPage();
  const { seen, settle } = watch(page);
  const result = { viewport: contextOptions.viewport };
  try {
    await signIn(page, token);
    await page.waitForSelector("body[data-loaded]", { state: "attached", timeout: TIMEOUT });
    Object.assign(result, await read(page));
    Object.assign(result, await overflow(page));
  } catch (error) {
    result.error = String(error && error.message ? error.message : error);
    try {
      Object.assign(result, await read(page));
    } catch (_) {
      // the page is gone: the error says why
    }
  }
  try {
    const path = join(artifacts, `${name}.png`);
    await page.screenshot({ path, fullPage: true, timeout: TIMEOUT });
    result.screenshot = path;
  } catch (error) {
    result.screenshot_error = String(error && error.message ? error.message : error);
  }
  await settle();
  await context.close();
  return { ...result, ...seen };
}

/** Signs in with a token the satellite does not know: the page should say so on the sign-in form. */
async function wrongTokenRun(browser) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const { seen, settle } = watch(page);
  const result = {};
  try {
    await signIn(page, `wrong-${Date.now()}`);
    await page.waitForFunction(() => {
      const error = document.getElementById("sign-in-error");
      return error && error.textContent.trim() !== "";
    }, null, { timeout: TIMEOUT });
  } catch (error) {
    result.error = String(error && error.message ? error.message : error);
  }
  try {
    const state = await read(page);
    result.sign_in_error = state.sign_in_error;
    result.sign_in_error_shown = Boolean(state.sign_in_error && state.sign_in_error.trim());
    result.sign_in_visible = state.sign_in_visible;
    result.dashboard_visible = state.dashboard_visible;
    result.loaded = state.loaded;
  } catch (error) {
    result.read_error = String(error && error.message ? error.message : error);
  }
  try {
    const path = join(artifacts, "wrong_token.png");
    await page.screenshot({ path, fullPage: true, timeout: TIMEOUT });
    result.screenshot = path;
  } catch (error) {
    result.screenshot_error = String(error && error.message ? error.message : error);
  }
  await settle();
  await context.close();
  delete seen.api_summaries;
  return { ...result, ...seen };
}

async function main() {
  mkdirSync(artifacts, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
    timeout: TIMEOUT,
  });
  try {
    const desktop = await goodRun(browser, "desktop", { viewport: { width: 1280, height: 900 } });
    const phone = await goodRun(browser, "phone", {
      viewport: { width: 390, height: 844 },
      deviceScaleFactor: 2,
      isMobile: true,
      hasTouch: true,
    });
    const wrong_token = await wrongTokenRun(browser);
    return { browser: browser.version(), desktop, phone, wrong_token };
  } finally {
    await browser.close();
  }
}

main().then(
  (report) => {
    process.stdout.write(JSON.stringify(report) + "\n");
    process.exit(0);
  },
  (error) => {
    console.error(`admin_page.mjs: ${error && error.stack ? error.stack : error}`);
    process.exit(2);
  },
);
