//! The web timeline of `keel serve` (DESIGN.md §9 `GET /`): the real binary on
//! 127.0.0.1:0, its one-time login link, the cookie and its CSRF checks over real HTTP,
//! hostile ledger text, and the page in headless Chromium (Debian's `chromium`, which
//! `.ci/run` installs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::redirect::Policy;
use serde_json::{Value, json};

use super::serve_e2e::harness::{Host, TOKEN};
use super::support::Env;

/// A new one-time login link from the API (bearer).
async fn mint(host: &Host) -> String {
    let response = http().post(host.url("/v1/web/logins")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    host.url(body["path"].as_str().unwrap())
}

/// Logs in with `link`; the cookie pair (`keel_web=…`) and the whole Set-Cookie value.
async fn login(link: &str) -> (String, String) {
    let response = http().get(link).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/");
    let set = response.headers()["set-cookie"].to_str().unwrap().to_owned();
    let pair = set.split(';').next().unwrap().trim().to_owned();
    (pair, set)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().redirect(Policy::none()).build().unwrap()
}

/// A script that writes `file` (a call that needs approval under `ask`), then is done.
fn write_script(env: &Env, name: &str, file: &str) -> PathBuf {
    let steps = json!({"steps": [
        {"text": "Writing the note.",
         "tool_calls": [{"name": "write_file", "arguments": {"path": file, "content": "hello\nworld\n"}}]},
        {"text": "Done."}
    ]});
    env.write_script(name, &steps.to_string())
}

/// The page's DOM after load, as headless Chromium serialises it.
fn chromium(args: &[&str], url: &str, profile: &Path) -> String {
    let binary = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
        })
        .expect("headless Chromium is needed for the web timeline test: apt-get install chromium (.ci/run does)");
    std::fs::create_dir_all(profile).unwrap();
    let out_path = profile.join(format!("out-{}.txt", args.len()));
    let mut child = Command::new(binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium failed: {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(&out_path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_web_login_token_is_single_use_and_the_cookie_is_strict() {
    let env = Env::new();
    let host = Host::start(&env, &[]);
    // Not logged in: the page and the fragment say so, and show nothing of the ledger.
    let response = http().get(host.url("/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let (pair, set) = login(&host.login).await;
    assert!(set.contains("HttpOnly"), "{set}");
    assert!(set.contains("SameSite=Strict"), "{set}");
    assert!(set.contains("Path=/"), "{set}");
    assert!(!set.contains(TOKEN), "the bearer token is the cookie");
    // The link is spent: the same URL again logs nobody in.
    let again = http().get(&host.login).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    assert!(again.headers().get("set-cookie").is_none());
    // A wrong token neither.
    let wrong = http().get(host.url("/login?token=00")).send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    // The login secret is not a cookie.
    let secret = host.login.split("token=").nth(1).unwrap();
    let forged = http()
        .get(host.url("/"))
        .header("cookie", format!("keel_web={secret}"))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    // The legitimate neighbour: the cookie opens the page, with its CSP, and reads the API.
    let page = http().get(host.url("/")).header("cookie", &pair).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    let html = page.text().await.unwrap();
    assert!(html.contains("<script src=\"/web/app.js\" defer></script>"));
    assert!(!html.contains("<script>"), "inline script on the page");
    let listed = http().get(host.url("/v1/sessions")).header("cookie", &pair).send().await.unwrap();
    assert_eq!(listed.status(), StatusCode::OK);
    // A minted link works once too.
    let minted = mint(&host).await;
    login(&minted).await;
    assert_eq!(http().get(&minted).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_web_cross_origin_and_headerless_posts_with_the_cookie_are_refused() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "ask.json", "note.txt");
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write the note").await;
    let pending = client.pending(&session).await;
    let call = pending["call_id"].as_str().unwrap();
    let path = format!("/v1/sessions/{session}/permissions/{call}");
    let (cookie, _) = login(&host.login).await;
    let post = |origin: Option<String>, csrf: bool, site: Option<&'static str>| {
        let mut request = http()
            .post(host.url(&path))
            .header("cookie", &cookie)
            .json(&json!({"answer": "allow_once"}));
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if csrf {
            request = request.header("x-keel-web", "1");
        }
        if let Some(site) = site {
            request = request.header("sec-fetch-site", site);
        }
        request.send()
    };
    // A cross-site form post: no custom header (a form cannot send one).
    let response =
        post(Some("http://evil.test".to_owned()), false, Some("cross-site")).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // The header but another origin (a script elsewhere; a real browser would also need a
    // preflight the host never answers).
    let response = post(Some("http://evil.test".to_owned()), true, None).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // Same origin but without the header (a plain HTML form of the page, script off).
    let response = post(Some(host.base.clone()), false, None).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // No Origin at all.
    let response = post(None, true, None).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // A rebound DNS name pointing at loopback.
    let response = http()
        .post(host.url(&path))
        .header("cookie", &cookie)
        .header("host", "evil.test")
        .header("origin", "http://evil.test")
        .header("x-keel-web", "1")
        .json(&json!({"answer": "allow_once"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // Minting a login link is a state change too.
    let response = http()
        .post(host.url("/v1/web/logins"))
        .header("cookie", &cookie)
        .header("origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    // Nothing was answered, nothing written.
    assert_eq!(client.pending(&session).await["call_id"], call);
    assert!(!workspace.join("note.txt").exists());
    // The legitimate neighbour: the page's own request is accepted and the run goes on.
    let response = post(Some(host.base.clone()), true, Some("same-origin")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{}", response.text().await.unwrap());
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("note.txt")).unwrap(), "hello\nworld\n");
}

/// Hostile text everywhere the ledger carries outside text: the model's words, a file
/// name, a file's content that comes back as tool output, with terminal escapes.
fn hostile_script(env: &Env) -> PathBuf {
    let name = "x\"><img src=x onerror=\"document.body.dataset.pwned=1\">.txt";
    let content =
        "<script>document.body.dataset.pwned=2</script>\u{1b}[2K\u{1b}]52;c;aGk=\u{7}\u{202e}end\n";
    let steps = json!({"steps": [
        {"text": "<script>document.body.dataset.pwned=3</script><b onmouseover=x>hi</b>",
         "tool_calls": [{"name": "write_file", "arguments": {"path": name, "content": content}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": name}}]},
        {"text": "\"onerror=alert(1) done \u{1b}[31mred"}
    ]});
    env.write_script("hostile.json", &steps.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_web_hostile_ledger_text_is_escaped_in_the_page_and_fragments() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = hostile_script(&env);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "auto").await;
    client.turn(&session, "<script>alert('input')</script>").await;
    client.wait_state(&session, "completed").await;
    let (cookie, _) = login(&host.login).await;
    let page = http()
        .get(host.url(&format!("/?session={session}")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let fragment: Value = http()
        .get(host.url(&format!("/web/sessions/{session}/fragment?after=0")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = fragment["entries"].as_str().unwrap();
    for html in [page.as_str(), entries] {
        assert!(!html.contains("<script>document"), "a script got through");
        assert!(!html.contains("<script>alert"), "a script got through");
        assert!(!html.contains("<img"), "an element got through");
        assert!(!html.contains("<b onmouseover"), "an element got through");
        assert!(!html.contains("\"onerror"), "an attribute broke out");
        assert!(!html.contains('\u{1b}'), "a terminal escape got through");
        assert!(!html.contains('\u{202e}'), "a BiDi override got through");
        // The legitimate neighbour: the text is there, shown as text.
        assert!(html.contains("&lt;script&gt;document.body.dataset.pwned=2&lt;/script&gt;"));
        assert!(
            html.contains(
                "&lt;img src=x onerror=&quot;document.body.dataset.pwned=1&quot;&gt;.txt"
            )
        );
        assert!(html.contains("\\x1b[2K"), "the escape is not shown");
        assert!(html.contains("&quot;onerror=alert(1) done \\x1b[31mred"));
    }
    assert!(page.contains("&lt;script&gt;alert(&#39;input&#39;)&lt;/script&gt;"));

    // In a real browser nothing of it runs.
    let profile = tempfile::tempdir().unwrap();
    let link = mint(&host).await;
    let url = link;
    let profile_path = profile.path().to_path_buf();
    let dom = tokio::task::spawn_blocking(move || chromium(&["--dump-dom"], &url, &profile_path))
        .await
        .unwrap();
    assert!(dom.contains(&session), "the page did not load: {dom}");
    assert!(!dom.contains("data-pwned"), "injected script ran: {dom}");
    assert!(!dom.contains("<img"), "an injected element is in the DOM");
    assert!(dom.contains("&lt;script&gt;document.body.dataset.pwned=2&lt;/script&gt;"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_timeline_in_headless_chromium_shows_the_session_and_answers_its_approval() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "ask.json", "note.txt");
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write the note").await;
    let pending = client.pending(&session).await;
    let call = pending["call_id"].as_str().unwrap().to_owned();

    // The printed one-time link, in a real browser: it logs in, lands on `/`, and the DOM
    // (after the page's script ran) shows the session, its timeline and the approval.
    let profile = tempfile::tempdir().unwrap();
    let (link, profile_path) = (host.login.clone(), profile.path().to_path_buf());
    let dom = tokio::task::spawn_blocking(move || chromium(&["--dump-dom"], &link, &profile_path))
        .await
        .unwrap();
    assert!(dom.contains(&format!("data-session=\"{session}\"")), "{dom}");
    assert!(dom.contains("class=\"session state-running current\""), "{dom}");
    for entry in [
        "kind-session_created",
        "kind-turn_started",
        "kind-model_response",
        "kind-permission_requested",
    ] {
        assert!(dom.contains(entry), "no {entry} entry: {dom}");
    }
    assert!(dom.contains("write the note"));
    assert!(dom.contains("Writing the note."));
    // The write's diff.
    assert!(dom.contains("<span class=\"add\">+ hello</span>"), "{dom}");
    assert!(dom.contains("Pending approvals"));
    let action = format!("/v1/sessions/{session}/permissions/{call}");
    assert!(
        dom.contains(&format!("action=\"{action}\" data-answer=\"allow_once\"")),
        "the allow button does not post to the API: {dom}"
    );
    assert!(dom.contains("data-answer=\"deny\""));
    // The printed link is spent now.
    assert_eq!(http().get(&host.login).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);

    // The screenshot (docs/web-timeline.png comes from here).
    let shot = profile.path().join("timeline.png");
    let (link, profile_path, shot_arg) = (
        mint(&host).await,
        profile.path().join("shot"),
        format!("--screenshot={}", profile.path().join("timeline.png").display()),
    );
    tokio::task::spawn_blocking(move || {
        chromium(&[shot_arg.as_str(), "--window-size=1200,900"], &link, &profile_path)
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    if let Ok(to) = std::env::var("KEEL_WEB_SCREENSHOT_TO") {
        std::fs::copy(&shot, to).unwrap();
    }

    // Clicking allow: the page's script posts {answer} to the form's action with the
    // cookie and its CSRF header from the page's origin. The same request here.
    let (cookie, _) = login(&mint(&host).await).await;
    let response = http()
        .post(host.url(&action))
        .header("cookie", &cookie)
        .header("origin", host.base.clone())
        .header("x-keel-web", "1")
        .header("sec-fetch-site", "same-origin")
        .json(&json!({"answer": "allow_once"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["answer"], "allow_once");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("note.txt")).unwrap(), "hello\nworld\n");

    // The page again: the outcome and the answer, no approval left.
    let (link, profile_path) = (mint(&host).await, profile.path().join("after"));
    let dom = tokio::task::spawn_blocking(move || chromium(&["--dump-dom"], &link, &profile_path))
        .await
        .unwrap();
    for entry in ["kind-permission_settled", "kind-tool_result", "kind-run_completed"] {
        assert!(dom.contains(entry), "no {entry} entry: {dom}");
    }
    assert!(dom.contains("allow_once</b> by remote"), "{dom}");
    assert!(!dom.contains("Pending approvals"), "{dom}");
    assert!(dom.contains("class=\"session state-completed current\""), "{dom}");
}
