"""``GET /``: a page to try the server from a browser, self-contained (its style and script inline,
nothing loaded from elsewhere). It says which weights the server runs, sends the form to
``/v1/reconstruct?format=preview`` and shows the picture, the warnings about the inputs and the OBJ,
PLY and GLB downloads the answer carries."""

from __future__ import annotations

import html

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>xmesh serve</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; color: #222; }
fieldset { border: 1px solid #ccd; margin: 0 0 1em; }
textarea { width: 100%; font: 13px monospace; }
#status { margin: 1em 0; }
#status.error { color: #a00; }
#picture { max-width: 100%; border: 1px solid #ccd; }
#downloads a { margin-right: 1.5em; }
#weights.synthetic { background: #fff4d6; border: 1px solid #e0b040; padding: 0.5em 0.8em; }
#warnings { color: #8a5a00; }
</style>
</head>
<body>
<h1>xmesh serve</h1>
<p>Three photos of an object, in view order, and their cameras: Pixel2Mesh++ returns its mesh.
The same request from a script: <code>POST /v1/reconstruct</code> (see <code>GET /v1/info</code>).</p>
<p id="weights" class="@WEIGHTS_CLASS@">@WEIGHTS@</p>
<form id="form">
<fieldset><legend>Photos (PNG or JPEG, three, in view order)</legend>
<input id="images" name="images" type="file" accept="image/png,image/jpeg" multiple required>
</fieldset>
<fieldset><legend>Cameras</legend>
<label><input type="radio" name="kind" value="cameras" checked>
camera rows: [azimuth, elevation, 0, distance, 25] per view</label><br>
<label><input type="radio" name="kind" value="poses"> poses JSON (as <code>xmesh reconstruct --poses</code>)</label>
<textarea id="cameras" rows="6">[[0, 25, 0, 0.8, 25], [120, 25, 0, 0.8, 25], [240, 25, 0, 0.8, 25]]</textarea>
</fieldset>
<button id="send" type="submit">Reconstruct</button>
</form>
<div id="status"></div>
<ul id="warnings"></ul>
<div id="result" hidden>
<img id="picture" alt="the views and the reconstructed meshes">
<p id="downloads"></p>
</div>
<script>
(function () {
  var form = document.getElementById('form');
  var status = document.getElementById('status');
  function say(text, isError) { status.textContent = text; status.className = isError ? 'error' : ''; }
  function blobLink(name, base64, type) {
    var bytes = Uint8Array.from(atob(base64), function (c) { return c.charCodeAt(0); });
    var a = document.createElement('a');
    a.href = URL.createObjectURL(new Blob([bytes], {type: type}));
    a.download = name;
    a.textContent = name + ' (' + bytes.length + ' bytes)';
    return a;
  }
  form.addEventListener('submit', function (event) {
    event.preventDefault();
    var files = document.getElementById('images').files;
    var kind = form.querySelector('input[name=kind]:checked').value;
    var body = new FormData();
    for (var i = 0; i < files.length; i++) { body.append('images', files[i], files[i].name); }
    body.append(kind, document.getElementById('cameras').value);
    say('reconstructing...', false);
    var warned = document.getElementById('warnings');
    warned.textContent = '';
    var started = performance.now();
    fetch('/v1/reconstruct?format=preview', {method: 'POST', body: body}).then(function (response) {
      return response.json().then(function (data) { return {ok: response.ok, data: data, headers: response.headers}; });
    }).then(function (answer) {
      if (!answer.ok) {
        say('refused: ' + (answer.data.field ? answer.data.field + ': ' : '') + answer.data.error, true);
        return;
      }
      var data = answer.data;
      (data.warnings || []).forEach(function (text) {
        var item = document.createElement('li');
        item.textContent = 'warning: ' + text;
        warned.appendChild(item);
      });
      document.getElementById('picture').src = 'data:image/png;base64,' + data.picture;
      var links = document.getElementById('downloads');
      links.textContent = '';
      links.appendChild(blobLink('mesh.obj', data.files.obj, 'model/obj'));
      links.appendChild(blobLink('mesh.ply', data.files.ply, 'application/x-ply'));
      links.appendChild(blobLink('mesh.glb', data.files.glb, 'model/gltf-binary'));
      document.getElementById('result').hidden = false;
      say(data.vertices + ' vertices, ' + data.faces + ' faces; batch of ' + answer.headers.get('X-Xmesh-Batch-Size') +
          ', ' + Math.round(performance.now() - started) + ' ms', false);
    }).catch(function (error) { say('failed: ' + error, true); });
  });
})();
</script>
</body>
</html>
"""


def page_html(info: dict) -> str:
    """The page for the server of ``info`` (``GET /v1/info``'s): it says which weights the server runs,
    set apart where they are the synthetic recipe's, not trained ones."""
    weights = info["weights"]
    if weights["synthetic"]:
        line = (
            f"This server runs {weights['description']}: its meshes show what the pipeline does, not what "
            "the trained network reconstructs."
        )
    else:
        line = f"This server runs {weights['description']}."
    return PAGE.replace("@WEIGHTS_CLASS@", "synthetic" if weights["synthetic"] else "trained").replace(
        "@WEIGHTS@", html.escape(line)
    )
