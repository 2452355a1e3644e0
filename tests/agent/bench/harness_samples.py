"""Logs for the harness parsers bound to one repository's runner (SWE-bench Multimodal / Multilingual rows).

Each log is what the row's test command prints, as the harness's eval script runs it (`set -uxo pipefail`: bash
echoes each command as `+ cmd` before its output, and several parsers split the log on that echo). The test
commands are the harness's own (SWE-bench/SWE-bench, swebench/harness/constants/{javascript,ruby,c}.py and
test_spec/javascript.py, which v5 rows carry in their eval_script). The tests named are ones each repository has.

MORE_CASES: parser -> (log, repo, FAIL_TO_PASS, PASS_TO_PASS, exit code), as test_harness_specs.CASES.
The parsers of FAIL_ONLY_REPOS (chart_js, marked, p5js, bpmn_js, openlayers, eslint) record failures only:
their runners' output names the passing tests (or only counts them) but the parser keeps no PASSED status, so
under the pass_and_fail rows of test_harness_specs their FAIL_TO_PASS is empty and the failing test is the
PASS_TO_PASS one (published rows of those repositories are graded fail_only).
"""

from __future__ import annotations

ESC = "\x1b"

# wp-calypso (version 10.16.3): `./node_modules/.bin/jest --verbose -c=test/client/jest.config.js '<path>'`
# (test_spec/javascript.py get_test_cmds_calypso); jest 24's verbose reporter: file line, describe blocks
# indented, "✓ name (Nms)" / "✕ name (Nms)", then the "●" failure details and the summary
CALYPSO = """+ ./node_modules/.bin/jest --verbose -c=test/client/jest.config.js client/lib/url/test/index.js
FAIL client/lib/url/test/index.js
  url
    isExternal()
      ✓ should return false for relative path (3ms)
      ✓ should return true for protocol-relative URLs (1ms)
      ✕ should return false for internal URLs (4ms)
    resemblesUrl()
      ✓ should detect a URL (1ms)

  ● url › isExternal() › should return false for internal URLs

    expect(received).toBe(expected) // Object.is equality

    Expected: false
    Received: true

      41 |       const source = 'https://wordpress.com/me';
      42 |
    > 43 |       expect( isExternal( source ) ).toBe( false );
         |                                      ^

      at Object.toBe (client/lib/url/test/index.js:43:38)

Test Suites: 1 failed, 1 total
Tests:       1 failed, 3 passed, 4 total
Snapshots:   0 total
Time:        2.871s
Ran all test suites matching /client\\/lib\\/url\\/test\\/index.js/i.
"""

# Chart.js (versions 2.x): `xvfb-run ... su chromeuser -c "gulp test"` (constants/javascript.py SPECS_CHART_JS);
# gulp's task log, then karma's progress reporter (karma.conf.js: reporters ['progress', 'kjhtml'], log level
# WARN): a failure is karma's SPEC_FAILURE "%s %s FAILED" written after the escape codes that erase the progress
# line (\x1b[1A\x1b[2K), its jasmine error tab-indented; passing specs are only counted ("Executed N of M")
CHART_JS = (
    "+ xvfb-run '--server-args=-screen 0 1280x1024x24 -ac :99' su chromeuser -c 'gulp test'\n"
    "[10:01:02] Using gulpfile /testbed/gulpfile.js\n"
    "[10:01:02] Starting 'test'...\n"
    "[10:01:02] Starting 'lint'...\n"
    "[10:01:02] Starting 'unittest'...\n"
    "[10:01:09] Finished 'lint' after 6.83 s\n"
    "Chrome 120.0.0.0 (Linux x86_64): Executed 0 of 2101 SUCCESS (0 secs / 0 secs)\n"
    f"{ESC}[1A{ESC}[2KChrome 120.0.0.0 (Linux x86_64): Executed 212 of 2101 SUCCESS (0 secs / 2.1 secs)\n"
    f"{ESC}[1A{ESC}[2KChrome 120.0.0.0 (Linux x86_64) Chart.controllers.bar should correctly count the number "
    "of stacks when a group is not specified FAILED\n"
    "\tExpected 3 to be 2.\n"
    "\t    at UserContext.<anonymous> (test/specs/controller.bar.tests.js:61:36)\n"
    "Chrome 120.0.0.0 (Linux x86_64): Executed 213 of 2101 (1 FAILED) (0 secs / 2.1 secs)\n"
    f"{ESC}[1A{ESC}[2KChrome 120.0.0.0 (Linux x86_64): Executed 2101 of 2101 (1 FAILED) (21.63 secs / 20.9 secs)\n"
    "TOTAL: 1 FAILED, 2100 SUCCESS\n"
    "[10:01:33] 'unittest' errored after 31 s\n"
    "[10:01:33] Error: 1\n"
)

# marked (version 1.x): `./node_modules/.bin/jasmine --no-color --config=jasmine.json`; jasmine's console
# reporter: a dot per spec, then "Failures:" listing "N) <suite> <spec>" and the "N specs, M failures" line
MARKED = """+ ./node_modules/.bin/jasmine --no-color --config=jasmine.json
Randomized with seed 53127
Started
......F.....


Failures:
1) Test paragraph token type should use the "paragraph" type on top level
  Message:
    Expected 'text' to equal 'paragraph'.
  Stack:
    Error: Expected 'text' to equal 'paragraph'.
        at <Jasmine>
        at UserContext.<anonymous> (/testbed/test/unit/marked-spec.js:96:36)
        at <Jasmine>

12 specs, 1 failure
Finished in 0.043 seconds
Randomized with seed 53127 (jasmine --random=true --seed=53127)
"""

# p5.js (version 1.x): `stdbuf -o 1M ./node_modules/.bin/grunt test --quiet --force`; the Gruntfile picks
# mocha's spec reporter under --quiet; mocha's epilogue lists each failure as "N) <suite>" with the nested
# titles on indented lines ending in ":"
P5JS = """+ stdbuf -o 1M ./node_modules/.bin/grunt test --quiet --force
Running "mochaChrome:test" (mochaChrome) task


  Rendering
    webgl assertions
      ✓ plane() should throw a WEBGL assertion Error
      1) rotateX() should throw a WEBGL assertion Error
  validateParameters: multi-format
    ✓ color(): no friendly-err-msg
  p5.Color
    p5.prototype.color(r,g,b)
      ✓ should create instance of p5.Color


  3 passing (1s)
  1 failing

  1) Rendering
       webgl assertions
         rotateX() should throw a WEBGL assertion Error:
     AssertionError: expected [Function] to throw an error
      at Context.<anonymous> (unit/core/rendering.js:117:16)

Warning: [mocha-chrome] 1 test failed Used --force, continuing.

Done, but with warnings.
"""

# react-pdf (version 2.0): `NODE_OPTIONS="--experimental-vm-modules" ./node_modules/.bin/jest --no-color
# packages/layout` (get_test_cmds_react_pdf); jest's default reporter: one PASS/FAIL line per test file,
# the slow ones with "(N.NNN s)"
REACT_PDF = """+ NODE_OPTIONS=--experimental-vm-modules ./node_modules/.bin/jest --no-color packages/layout
PASS packages/layout/tests/text/fromFragments.test.js
PASS packages/layout/tests/node/getMargin.test.js
FAIL packages/layout/tests/steps/resolveStyles.test.js (5.218 s)
  ● layout resolveStyles › Should resolve media queries

    expect(received).toEqual(expected) // deep equality

      88 |     expect(result.children[0].style).toEqual({ width: 20 });
         |                                      ^

      at Object.toEqual (packages/layout/tests/steps/resolveStyles.test.js:88:38)

Test Suites: 1 failed, 2 passed, 3 total
Tests:       1 failed, 41 passed, 42 total
Snapshots:   0 total
Time:        7.513 s
Ran all test suites matching /packages\\/layout/i.
"""

# immutable-js 2005: `npx jest __tests__/OrderedMap.ts __tests__/OrderedSet.ts --silent --json | jq -r ...`
# (constants/javascript.py JEST_JSON_JQ_TRANSFORM): jq prints "[STATUS] <ancestors> > <title>" per assertion
# result from jest's --json on stdout; jest's default reporter still writes its PASS/FAIL lines to stderr
JEST_JSON = """+ npx jest __tests__/OrderedMap.ts __tests__/OrderedSet.ts --silent --json
+ jq -r '.testResults[].assertionResults[] | "[" + (.status | ascii_upcase) + "] " + ((.ancestorTitles | join(" > ")) + (if .ancestorTitles | length > 0 then " > " else "" end) + .title)'
PASS __tests__/OrderedMap.ts
FAIL __tests__/OrderedSet.ts
  ● OrderedSet › removes correctly

    expect(received).toBe(expected) // Object.is equality

    Expected: 0
    Received: 1

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 5 passed, 6 total
Snapshots:   0 total
Time:        1.92 s
Ran all test suites matching /__tests__\\/OrderedMap.ts|__tests__\\/OrderedSet.ts/i.
[PASSED] OrderedMap > converts from object
[PASSED] OrderedMap > constructor provides initial values
[PASSED] OrderedMap > provides initial values in a mixed order
[PASSED] OrderedSet > provides initial values in a mixed order
[PASSED] OrderedSet > maintains order when new values are added
[FAILED] OrderedSet > removes correctly
"""

# preact 4152: `COVERAGE=false BABEL_NO_MODULES=true npx karma start karma.conf.js --single-run
# --grep="test/browser/components.test.js"` (constants/javascript.py SPECS_PREACT); karma-mocha-reporter
# (no colors without a tty): describe blocks indented, "✔ name" / "✖ name", then SUMMARY and FAILED TESTS
KARMA = """+ COVERAGE=false BABEL_NO_MODULES=true npx karma start karma.conf.js --single-run --grep=test/browser/components.test.js
isFork true
START:
05 12 2024 10:04:11.201:INFO [karma-server]: Karma v6.4.3 server started at http://localhost:9876/
05 12 2024 10:04:11.202:INFO [launcher]: Launching browsers ChromeNoSandboxHeadless with concurrency 2
05 12 2024 10:04:11.207:INFO [launcher]: Starting browser Chrome
05 12 2024 10:04:12.015:INFO [Chrome Headless 120.0.6099.109 (Linux x86_64)]: Connected on socket ab12 with id 63
  Components
    ✔ should render components
    ✔ should render functional components
    ✖ should not recycle common class children with different keys

Finished in 0.412 secs / 0.384 secs @ 10:04:12 GMT+0000 (Coordinated Universal Time)

SUMMARY:
✔ 2 tests completed
✖ 1 test failed

FAILED TESTS:
  Components
    ✖ should not recycle common class children with different keys
      Chrome Headless 120.0.6099.109 (Linux x86_64)
    AssertionError: expected spy to have been called once but was called twice
"""

# bpmn-js: `... su chromeuser -c "./node_modules/.bin/karma start test/config/karma.unit.js --no-colors"`
# (constants/javascript.py SPECS_BPMN_JS, ChromeHeadless launcher); karma's progress reporter: the failed spec's
# "<browser> <suites> <spec> FAILED" after the codes that erase the progress line; passing specs only counted
BPMN_JS = (
    "+ PUPPETEER_EXECUTABLE_PATH=/usr/bin/google-chrome-stable su chromeuser -c './node_modules/.bin/karma start "
    "test/config/karma.unit.js --no-colors'\n"
    "05 12 2024 10:06:40.118:INFO [karma-server]: Karma v6.4.2 server started at http://localhost:9876/\n"
    "05 12 2024 10:06:40.119:INFO [launcher]: Launching browsers ChromeNoSandbox with concurrency unlimited\n"
    "05 12 2024 10:06:40.124:INFO [launcher]: Starting browser ChromeHeadless\n"
    "05 12 2024 10:06:41.377:INFO [Chrome Headless 120.0.6099.109 (Linux x86_64)]: Connected on socket 3fQ with id 1\n"
    "Chrome Headless 120.0.6099.109 (Linux x86_64): Executed 0 of 2911 SUCCESS (0 secs / 0 secs)\n"
    f"{ESC}[1A{ESC}[2KChrome Headless 120.0.6099.109 (Linux x86_64): Executed 804 of 2911 SUCCESS (8.1 secs / 7.9 secs)\n"
    f"{ESC}[1A{ESC}[2KChrome Headless 120.0.6099.109 (Linux x86_64) features/modeling - #updateLabel should change "
    "name of start event FAILED\n"
    "\tAssertionError: expected 'foo' to equal 'bar'\n"
    "\t    at Context.<anonymous> (test/spec/features/modeling/UpdateLabelSpec.js:41:51)\n"
    "Chrome Headless 120.0.6099.109 (Linux x86_64): Executed 805 of 2911 (1 FAILED) (8.2 secs / 8 secs)\n"
    f"{ESC}[1A{ESC}[2KChrome Headless 120.0.6099.109 (Linux x86_64): Executed 2911 of 2911 (1 FAILED) "
    "(41.9 secs / 40.6 secs)\n"
    "TOTAL: 1 FAILED, 2910 SUCCESS\n"
)

# carbon: `yarn test packages/react/src/components/Tag/` (get_test_cmds_carbon); yarn v1's header, then jest's
# default reporter: a PASS/FAIL line per test file (slow ones with their time), failure details, summary
CARBON = """+ yarn test packages/react/src/components/Tag/
yarn run v1.22.19
$ jest packages/react/src/components/Tag/
PASS packages/react/src/components/Tag/Tag-test.js (6.789 s)
FAIL packages/react/src/components/Tag/__tests__/Tag-test.js
  ● Tag › should render a filter tag with a close button

    expect(received).toBeInTheDocument()

Test Suites: 1 failed, 1 passed, 2 total
Tests:       1 failed, 11 passed, 12 total
Snapshots:   3 passed, 3 total
Time:        9.402 s
Ran all test suites matching /packages\\/react\\/src\\/components\\/Tag\\//i.
error Command failed with exit code 1.
info Visit https://yarnpkg.com/en/docs/cli/run for documentation about this command.
"""

# eslint: `./node_modules/.bin/mocha --forbid-only --reporter min -t 10000 --no-colors
# "tests/{bin,conf,lib,tools}/**/*.js"`; mocha's min reporter clears the screen, then prints only the
# epilogue: counts, and each failure as "N) <suite>" with nested titles ending in ":", then the error
ESLINT = (
    "+ ./node_modules/.bin/mocha --forbid-only --reporter min -t 10000 --no-colors "
    "'tests/{bin,conf,lib,tools}/**/*.js'\n"
    f"{ESC}[2J{ESC}[1;3H\n"
    "  8214 passing (1m)\n"
    "  1 failing\n"
    "\n"
    "  1) Linter\n"
    "       when evaluating code containing /*global */ and /*globals */ blocks\n"
    "         variables should be available in global scope:\n"
    "\n"
    "      AssertionError [ERR_ASSERTION]: Expected values to be strictly equal:\n"
    "\n"
    "false !== true\n"
    "\n"
    "      + expected - actual\n"
    "\n"
    "      -false\n"
    "      +true\n"
    "      \n"
    "      at Linter.<anonymous> (tests/lib/linter/linter.js:1067:24)\n"
    "\n"
)

# grommet: `yarn test` (constants/javascript.py SPECS_GROMMET); yarn v1 and jest's default reporter: a
# PASS/FAIL line per test file, failure details, summary
GROMMET = """+ yarn test
yarn run v1.22.21
$ jest
PASS src/js/components/Box/__tests__/Box-test.tsx (12.044 s)
PASS src/js/components/Anchor/__tests__/Anchor-test.tsx
FAIL src/js/components/Select/__tests__/Select-test.tsx (21.9 s)
  ● Select › select an option with enter

    expect(received).toHaveBeenCalledWith(...expected)

Test Suites: 1 failed, 2 passed, 3 total
Tests:       1 failed, 204 passed, 205 total
Snapshots:   188 passed, 188 total
Time:        38.2 s
Ran all test suites.
error Command failed with exit code 1.
info Visit https://yarnpkg.com/en/docs/cli/run for documentation about this command.
"""

# highlight.js (version 11.x): `npm run test` (mocha test); mocha's spec reporter: describe blocks indented,
# "✔ title" (slow ones with "(Nms)"), a failure inline as "N) title"; the epilogue after "N passing"
HIGHLIGHTJS = """+ npm run test

> highlight.js@11.5.1 test
> mocha test



  hljs.highlightAuto()
    ✔ compiling the grammars (48ms)

  highlight() markup
    javascript
      ✔ should markup arrow-function
      1) should markup class
    xml
      ✔ should markup document-type-variations

  hljs.highlightAuto()
    ✔ should be detected as javascript (11ms)


  4 passing (2s)
  1 failing

  1) highlight() markup
       javascript
         should markup class:

      AssertionError [ERR_ASSERTION]: Expected values to be strictly equal:
      + actual - expected

      at Context.<anonymous> (test/markup/index.js:34:14)

"""

# lighthouse (versions before 3.0): `./node_modules/.bin/mocha --reporter json <test file>`
# (get_test_cmds_lighthouse); mocha's JSON reporter: stats, tests, pending, failures, passes, 2-space indented
LIGHTHOUSE = """+ ./node_modules/.bin/mocha --reporter json lighthouse-core/test/audits/viewport-test.js
{
  "stats": {
    "suites": 1,
    "tests": 3,
    "passes": 2,
    "pending": 0,
    "failures": 1,
    "start": "2024-12-05T10:08:01.113Z",
    "end": "2024-12-05T10:08:01.131Z",
    "duration": 18
  },
  "tests": [
    {
      "title": "fails when HTML does not contain a viewport meta tag",
      "fullTitle": "Mobile-friendly: viewport audit fails when HTML does not contain a viewport meta tag",
      "duration": 1,
      "currentRetry": 0,
      "err": {}
    },
    {
      "title": "fails when HTML contains a non-mobile friendly viewport meta tag",
      "fullTitle": "Mobile-friendly: viewport audit fails when HTML contains a non-mobile friendly viewport meta tag",
      "duration": 2,
      "currentRetry": 0,
      "err": {
        "message": "expected true to equal false",
        "stack": "AssertionError: expected true to equal false\\n    at Context.it (lighthouse-core/test/audits/viewport-test.js:24:12)"
      }
    },
    {
      "title": "passes when a viewport is provided",
      "fullTitle": "Mobile-friendly: viewport audit passes when a viewport is provided",
      "duration": 0,
      "currentRetry": 0,
      "err": {}
    }
  ],
  "pending": [],
  "failures": [
    {
      "title": "fails when HTML contains a non-mobile friendly viewport meta tag",
      "fullTitle": "Mobile-friendly: viewport audit fails when HTML contains a non-mobile friendly viewport meta tag",
      "duration": 2,
      "currentRetry": 0,
      "err": {
        "message": "expected true to equal false",
        "stack": "AssertionError: expected true to equal false\\n    at Context.it (lighthouse-core/test/audits/viewport-test.js:24:12)"
      }
    }
  ],
  "passes": [
    {
      "title": "fails when HTML does not contain a viewport meta tag",
      "fullTitle": "Mobile-friendly: viewport audit fails when HTML does not contain a viewport meta tag",
      "duration": 1,
      "currentRetry": 0,
      "err": {}
    },
    {
      "title": "passes when a viewport is provided",
      "fullTitle": "Mobile-friendly: viewport audit passes when a viewport is provided",
      "duration": 0,
      "currentRetry": 0,
      "err": {}
    }
  ]
}"""

# alibaba-fusion/next (karma versions): `timeout 2m bash -c '... xvfb-run ... su chromeuser -c "npm run test
# balloon"'` (get_test_cmds_next); karma-spec-reporter after karma's "Starting browser Chrome": suites indented,
# "✓ name" / "✗ name" (colored by the `colors` module, scripts/test/karma.js: colors true), a failure's error
# lines tab-indented after it; then the browser's line, TOTAL and the reporter's error summary
NEXT = (
    "+ timeout 2m bash -c 'PUPPETEER_EXECUTABLE_PATH=/usr/bin/google-chrome-stable xvfb-run "
    '--server-args="-screen 0 1280x1024x24 -ac :99" su chromeuser -c "npm run test balloon"\'\n'
    '\n> @alifd/next@1.19.21 test /testbed\n> node ./scripts/test/index.js "balloon"\n\n'
    "05 12 2024 10:10:20.555:INFO [karma-server]: Karma v4.4.1 server started at http://localhost:9877/\n"
    "05 12 2024 10:10:20.556:INFO [launcher]: Launching browsers Chrome with concurrency unlimited\n"
    "05 12 2024 10:10:20.561:INFO [launcher]: Starting browser Chrome\n"
    "05 12 2024 10:10:22.101:INFO [Chrome 120.0.6099 (Linux 0.0.0)]: Connected on socket x1 with id 9821\n"
    "\n"
    "  Balloon\n"
    f"    {ESC}[32m✓ {ESC}[39mshould render\n"
    f"    {ESC}[32m✓ {ESC}[39mshould render closable balloon\n"
    f"    {ESC}[31m✗ {ESC}[39m{ESC}[31mshould be controlled by visible{ESC}[39m\n"
    "\tAssertionError: expected false to be true\n"
    "\t    at Context.<anonymous> (test/balloon/index-spec.js:88:38)\n"
    "\n"
    f"Chrome 120.0.6099 (Linux 0.0.0): Executed 3 of 3 {ESC}[31m(1 FAILED){ESC}[39m (1.204 secs / 1.113 secs)\n"
    f"{ESC}[31mTOTAL: 1 FAILED, 2 SUCCESS{ESC}[39m\n"
    "\n\n"
    f"{ESC}[31m1) should be controlled by visible\n{ESC}[39m"
    f"{ESC}[31m     Balloon\n{ESC}[39m"
    f"{ESC}[90m     AssertionError: expected false to be true\n"
    f"    at Context.<anonymous> (test/balloon/index-spec.js:88:38)\n{ESC}[39m"
    "\n"
    "\n"
)

# openlayers (spec tests): `... su chromeuser -c "npm run karma -- --single-run --log-level error"`
# (get_test_cmds_openlayers); karma's dots reporter in Chrome Headless: a dot per spec, a failure as karma's
# "<browser> <suites> <spec> FAILED" with the mocha error tab-indented, then the browser's totals
OPENLAYERS = (
    "+ PUPPETEER_EXECUTABLE_PATH=/usr/bin/google-chrome-stable xvfb-run '--server-args=-screen 0 1280x1024x24 -ac "
    ":99' su chromeuser -c 'npm run karma -- --single-run --log-level error'\n"
    "\n> ol@7.1.0 karma\n> karma start test/browser/karma.config.cjs --single-run --log-level error\n\n"
    "................................................................................\n"
    "Chrome Headless 120.0.6099.109 (Linux x86_64) ol/source/Vector #getFeaturesInExtent() returns the "
    "features in the extent FAILED\n"
    "\tError: expected [] to sort of equal [ { disposed: false } ]\n"
    "\t    at Assertion.assert (node_modules/expect.js/index.js:96:13)\n"
    "\t    at Context.<anonymous> (test/browser/spec/ol/source/Vector.test.js:212:35)\n"
    "................................................................................\n"
    "Chrome Headless 120.0.6099.109 (Linux x86_64): Executed 3302 of 3306 (1 FAILED) (skipped 4) "
    "(38.702 secs / 33.017 secs)\n"
    "TOTAL: 1 FAILED, 3301 SUCCESS\n"
)

# PrismJS: `./node_modules/.bin/mocha tests/run.js --reporter json --language javascript`
# (get_test_cmds_prism); tests/run.js names each test "– should pass test case '<file>'" under
# "Testing language '<lang>'"; mocha's JSON reporter
PRISMJS = """+ ./node_modules/.bin/mocha tests/run.js --reporter json --language javascript
{
  "stats": {
    "suites": 1,
    "tests": 2,
    "passes": 1,
    "pending": 0,
    "failures": 1,
    "start": "2024-12-05T10:12:44.702Z",
    "end": "2024-12-05T10:12:44.790Z",
    "duration": 88
  },
  "tests": [
    {
      "title": "– should pass test case 'template-string'",
      "fullTitle": "Testing language 'javascript' – should pass test case 'template-string'",
      "duration": 31,
      "currentRetry": 0,
      "err": {}
    },
    {
      "title": "– should pass test case 'regex_inclusion'",
      "fullTitle": "Testing language 'javascript' – should pass test case 'regex_inclusion'",
      "duration": 12,
      "currentRetry": 0,
      "err": {
        "message": "regex_inclusion.test: Expected token stream to be equal",
        "stack": "AssertionError: regex_inclusion.test: Expected token stream to be equal\\n    at Object.runTestCase (tests/helper/test-case.js:102:12)"
      }
    }
  ],
  "pending": [],
  "failures": [
    {
      "title": "– should pass test case 'regex_inclusion'",
      "fullTitle": "Testing language 'javascript' – should pass test case 'regex_inclusion'",
      "duration": 12,
      "currentRetry": 0,
      "err": {
        "message": "regex_inclusion.test: Expected token stream to be equal",
        "stack": "AssertionError: regex_inclusion.test: Expected token stream to be equal\\n    at Object.runTestCase (tests/helper/test-case.js:102:12)"
      }
    }
  ],
  "passes": [
    {
      "title": "– should pass test case 'template-string'",
      "fullTitle": "Testing language 'javascript' – should pass test case 'template-string'",
      "duration": 31,
      "currentRetry": 0,
      "err": {}
    }
  ]
}"""

# quarto-cli: `cd tests; QUARTO_TESTS_NO_CONFIG="true" ./run-tests.sh` (constants/javascript.py
# SPECS_QUARTOCLI); deno test's reporter (colored): "running N tests from <file>", a test's console output
# between "------- output -------" and "----- output end -----" (quarto's "[verify] > ..." lines outside CI),
# "<name> ... ok (Ns)" / "... FAILED (Ns)", then " ERRORS " and " FAILURES "; quarto's tests/test.ts names a
# test "[smoke] > <name>"
QUARTO_CLI = (
    "+ cp -r tests/ tests_tmp/\n"
    "+ cd tests\n"
    "+ QUARTO_TESTS_NO_CONFIG=true ./run-tests.sh\n"
    f"{ESC}[38;5;245mrunning 2 tests from ./smoke/render/render-callout.test.ts{ESC}[0m\n"
    "[smoke] > quarto render docs/callouts.qmd --to html ...\n"
    f"{ESC}[38;5;245m------- output -------{ESC}[0m\n"
    f"{ESC}[2m[verify] > No Errors or Warnings{ESC}[22m\n"
    f"{ESC}[2m[verify] > File docs/callouts.html exists{ESC}[22m\n"
    f"{ESC}[38;5;245m----- output end -----{ESC}[0m\n"
    f"[smoke] > quarto render docs/callouts.qmd --to html ... {ESC}[0m{ESC}[32mok{ESC}[0m "
    f"{ESC}[0m{ESC}[38;5;245m(2s){ESC}[0m\n"
    "[smoke] > quarto render docs/callouts.qmd --to pdf ...\n"
    f"{ESC}[38;5;245m------- output -------{ESC}[0m\n"
    f"{ESC}[2m[verify] > No Errors or Warnings{ESC}[22m\n"
    f"{ESC}[2m[verify] > File docs/callouts.pdf exists{ESC}[22m\n"
    f"{ESC}[38;5;245m----- output end -----{ESC}[0m\n"
    f"[smoke] > quarto render docs/callouts.qmd --to pdf ... {ESC}[0m{ESC}[31mFAILED{ESC}[0m "
    f"{ESC}[0m{ESC}[38;5;245m(9s){ESC}[0m\n"
    "\n"
    f"{ESC}[0m{ESC}[1m{ESC}[37m{ESC}[41m ERRORS {ESC}[0m\n"
    "\n"
    "[smoke] > quarto render docs/callouts.qmd --to pdf => ./smoke/render/render-callout.test.ts:12:1\n"
    f"{ESC}[0m{ESC}[1m{ESC}[31merror{ESC}[0m: Error: Verify failed: no file docs/callouts.pdf\n"
    "\n"
    f"{ESC}[0m{ESC}[1m{ESC}[37m{ESC}[41m FAILURES {ESC}[0m\n"
    "\n"
    "[smoke] > quarto render docs/callouts.qmd --to pdf => ./smoke/render/render-callout.test.ts:12:1\n"
    "\n"
    f"{ESC}[0m{ESC}[31mFAILED{ESC}[0m | 1 passed | 1 failed {ESC}[0m{ESC}[38;5;245m(11s){ESC}[0m\n"
)

# nlohmann/json 4237: `./build/tests/test-udt_cpp11 -s -r=xml` (constants/c.py SPECS_JSON); doctest's XML
# reporter with -s (successful assertions too): TestCase > SubCase > Expression success="true|false"
DOCTEST = """+ ./build/tests/test-udt_cpp11 -s -r=xml
<?xml version="1.0" encoding="UTF-8"?>
<doctest binary="./build/tests/test-udt_cpp11" version="2.4.11">
  <Options order_by="file" rand_seed="0" first="0" last="4294967295" abort_after="0" subcase_filter_levels="2147483647" case_sensitive="false" no_throw="false" no_skip="false"/>
  <TestSuite name="udt">
    <TestCase name="basic usage" filename="/testbed/tests/src/unit-udt.cpp" line="250">
      <SubCase name="conversion to json via free-functions" filename="/testbed/tests/src/unit-udt.cpp" line="262">
        <Expression success="true" type="CHECK" filename="/testbed/tests/src/unit-udt.cpp" line="264">
          <Original>
            json(a) == json(23)
          </Original>
          <Expanded>
            23 == 23
          </Expanded>
        </Expression>
      </SubCase>
      <SubCase name="conversion from json via free-functions" filename="/testbed/tests/src/unit-udt.cpp" line="280">
        <Expression success="false" type="CHECK" filename="/testbed/tests/src/unit-udt.cpp" line="286">
          <Original>
            a == big_json.get&lt;udt::age&gt;()
          </Original>
          <Expanded>
            23 == 0
          </Expanded>
        </Expression>
      </SubCase>
      <OverallResultsAsserts successes="1" failures="1" test_case_success="false"/>
    </TestCase>
  </TestSuite>
  <OverallResultsAsserts successes="1" failures="1"/>
  <OverallResultsTestCases successes="0" failures="1"/>
</doctest>
"""

# jekyll 8761: `bundle exec cucumber --publish-quiet --format progress --no-color features/post_data.feature:6
# features/post_data.feature:30` (constants/ruby.py SPECS_JEKYLL); under the progress format jekyll's
# features/support/formatter.rb prints each scenario's `<location>  "<name>"  ` before cucumber's step marks
# ("." passed, "F" failed, "-" skipped) and its time; cucumber's failures and counts, the formatter's offenders
CUCUMBER = """+ bundle exec cucumber --publish-quiet --format progress --no-color features/post_data.feature:6 features/post_data.feature:30

features/post_data.feature:6  "Use post.title variable"  ........  (0.431s)
features/post_data.feature:30  "Use page.name variable"  .......F  (0.387s)

(::) failed steps (::)

Expected to see "Page name: 2009-03-27-star-wars.markdown" in "Post name: " (RSpec::Expectations::ExpectationNotMetError)
./features/step_definitions.rb:265:in `/^I should (not )?see "(.*)" in "(.*)"$/'
features/post_data.feature:38:in `I should see "Page name: 2009-03-27-star-wars.markdown" in "_site/2009/03/27/star-wars.html"'

Failing Scenarios:
cucumber features/post_data.feature:30 # Scenario: Use page.name variable

2 scenarios (1 failed, 1 passed)
16 steps (1 failed, 15 passed)
0m0.819s


Worst offenders:
  features/post_data.feature:6   "Use post.title variable"                    (0.431s)
  features/post_data.feature:30  "Use page.name variable"                     (0.387s)
"""

# jekyll 9141: `bundle exec ruby -I test test/test_site.rb -v -n "/static files/"` (constants/ruby.py);
# jekyll's test/helper.rb uses minitest-reporters' DefaultReporter (color), which under -v prints
# "<Class>#<test name> <time> = <mark>"; shoulda-context names tests "test_: <context> should <name>. "
MINITEST = f"""+ bundle exec ruby -I test test/test_site.rb -v -n '/static files/'
# -------------------------------------------------------------
# SPECS AND TESTS ARE RUNNING WITH WARNINGS OFF.
# SEE: https://github.com/Shopify/liquid/issues/730
# SEE: https://github.com/jekyll/jekyll/issues/4719
# -------------------------------------------------------------

# Running tests with run options -v -n "/static files/" --seed 42837:


TestSite#test_: creating sites should write only modified static files.  0.07 = {ESC}[32m.{ESC}[0m
TestSite#test_: static files in a collection should be exposed via site instance.  0.02 = {ESC}[32m.{ESC}[0m
TestSite#test_: static files in a collection should not be revisited in `Site#each_site_file`.  0.03 = {ESC}[31mF{ESC}[0m

Finished tests in 0.124060s, 24.1819 tests/s, 40.3031 assertions/s.

{ESC}[31mFailure:
TestSite#test_: static files in a collection should not be revisited in `Site#each_site_file`.  [/testbed/test/test_site.rb:757]
Minitest::Assertion: Expected: 1
  Actual: 2{ESC}[0m

{ESC}[31m3 tests, 5 assertions, 1 failures, 0 errors, 0 skips{ESC}[0m
"""

# rubocop: `bundle exec rspec spec/rubocop/cop/style/file_null_spec.rb --no-color --format json |
# RUBOCOP_RSPEC_JQ_TRANSFORM` (constants/ruby.py): bash's trace of the pipeline (the multi-line jq program
# included), then jq's "<description> - <status>" per description
RSPEC_TRANSFORMED_JSON = """+ bundle exec rspec spec/rubocop/cop/style/file_null_spec.rb --no-color --format json
+ sed -n '/^{/,$p'
+ jq -r '.examples | group_by(.description) | .[] |
    if any(select(.status == "failed")) then
      (.[0] | "\\(.description) - failed")
    else
      (.[0] | "\\(.description) - \\(.status)")
    end'
does not register an offense for an empty string - passed
does not register an offense for a string within %w[] - passed
registers an offense and corrects when the entire string is `/dev/null` - failed
"""

MORE_CASES = {
    "parse_log_calypso": (CALYPSO, "Automattic/wp-calypso",
                          ["url - isExternal() - should return false for relative path"],
                          ["url - isExternal() - should return false for internal URLs"], 1),
    "parse_log_chart_js": (CHART_JS, "chartjs/Chart.js", [],
                           ["Chart.controllers.bar should correctly count the number of stacks when a group is not "
                            "specified "], 1),
    "parse_log_marked": (MARKED, "markedjs/marked", [],
                         ['Test paragraph token type should use the "paragraph" type on top level'], 1),
    "parse_log_p5js": (P5JS, "processing/p5.js", [],
                       ["Rendering:webgl assertions:rotateX() should throw a WEBGL assertion Error"], 1),
    "parse_log_react_pdf": (REACT_PDF, "diegomura/react-pdf", ["packages/layout/tests/text/fromFragments.test.js"],
                            ["packages/layout/tests/steps/resolveStyles.test.js"], 1),
    "parse_log_jest_json": (JEST_JSON, "immutable-js/immutable-js", ["OrderedMap > converts from object"],
                            ["OrderedSet > removes correctly"], 1),
    "parse_log_karma": (KARMA, "preactjs/preact", ["Components > should render components"],
                        ["Components > should not recycle common class children with different keys"], 1),
    "parse_log_bpmn_js": (BPMN_JS, "bpmn-io/bpmn-js", [],
                          ["features/modeling - #updateLabel should change name of start event "], 1),
    "parse_log_carbon": (CARBON, "carbon-design-system/carbon", ["packages/react/src/components/Tag/Tag-test.js"],
                         ["packages/react/src/components/Tag/__tests__/Tag-test.js"], 1),
    "parse_log_eslint": (ESLINT, "eslint/eslint", [],
                         ["Linter when evaluating code containing /*global */ and /*globals */ blocks variables "
                          "should be available in global scope:"], 1),
    "parse_log_grommet": (GROMMET, "grommet/grommet", ["src/js/components/Box/__tests__/Box-test.tsx"],
                          ["src/js/components/Select/__tests__/Select-test.tsx"], 1),
    "parse_log_highlightjs": (HIGHLIGHTJS, "highlightjs/highlight.js", ["javascript.should markup arrow-function"],
                              ["javascript.should markup class"], 1),
    "parse_log_lighthouse": (LIGHTHOUSE, "GoogleChrome/lighthouse",
                             ["Mobile-friendly: viewport audit passes when a viewport is provided"],
                             ["Mobile-friendly: viewport audit fails when HTML contains a non-mobile friendly "
                              "viewport meta tag"], 1),
    "parse_log_next": (NEXT, "alibaba-fusion/next", ["Balloon - should render"],
                       ["Balloon - should be controlled by visible"], 1),
    "parse_log_openlayers": (OPENLAYERS, "openlayers/openlayers", [],
                             ["ol/source/Vector #getFeaturesInExtent() returns the features in the extent"], 1),
    "parse_log_prismjs": (PRISMJS, "PrismJS/prism",
                          ["Testing language 'javascript' – should pass test case 'template-string'"],
                          ["Testing language 'javascript' – should pass test case 'regex_inclusion'"], 1),
    "parse_log_quarto_cli": (QUARTO_CLI, "quarto-dev/quarto-cli",
                             ["[smoke] > quarto render docs/callouts.qmd --to html"],
                             ["[smoke] > quarto render docs/callouts.qmd --to pdf"], 1),
    "parse_log_doctest": (DOCTEST, "nlohmann/json", ["basic usage > conversion to json via free-functions"],
                          ["basic usage > conversion from json via free-functions"], 1),
    "parse_log_cucumber": (CUCUMBER, "jekyll/jekyll", ['features/post_data.feature:6  "Use post.title variable" '],
                           ['features/post_data.feature:30  "Use page.name variable" '], 1),
    "parse_log_minitest": (MINITEST, "jekyll/jekyll",
                           ["TestSite#test_: creating sites should write only modified static files"],
                           ["TestSite#test_: static files in a collection should not be revisited in "
                            "`Site#each_site_file`"], 1),
    "parse_log_rspec_transformed_json": (RSPEC_TRANSFORMED_JSON, "rubocop/rubocop",
                                         ["does not register an offense for an empty string"],
                                         ["registers an offense and corrects when the entire string is "
                                          "`/dev/null`"], 1),
}  # fmt: skip
