// Script-tag build (copied to dist/straddle.js by `cargo xtask build-web`):
// <script src=".../dist/straddle.js"></script> defines window.Straddle.
// The ES module, its engine worker and the .wasm are fetched from next to this file
// (../src/, ../pkg/), so a page needs no bundler and no import map.
(function () {
  "use strict";
  var here = document.currentScript && document.currentScript.src;
  if (!here) throw new Error("straddle.js must be loaded with a <script src> tag");
  var loaded = null;
  function load() {
    if (!loaded) loaded = import(new URL("../src/index.js", here).href);
    return loaded;
  }
  window.Straddle = {
    /** Same options as the module's Straddle.create; resolves to a client. */
    create: function (options) {
      return load().then(function (m) { return m.Straddle.create(options); });
    },
    /** The StraddleError class, once the module is loaded. */
    load: load,
  };
})();
