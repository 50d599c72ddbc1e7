// Module and chunk ids from their (context-relative) names, not from hashes in a 3-digit space:
// hashed ids collide depending on the absolute build path (shared modules' identifiers hold
// it), so a rebuild elsewhere (CI, tests/test_labextension_build.py) would differ.
module.exports = {
  optimization: {
    moduleIds: 'named',
    chunkIds: 'named'
  }
};
