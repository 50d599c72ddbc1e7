"use strict";(self.rspackChunktfdist_nb=self.rspackChunktfdist_nb||[]).push([["style_index_js"],{"./node_modules/css-loader/dist/cjs.js!./style/base.css"(t,e,r){var o=r("./node_modules/css-loader/dist/runtime/noSourceMaps.js"),a=r.n(o),s=r("./node_modules/css-loader/dist/runtime/api.js"),i=(r.n(s))()(a());i.push([t.id,`/* tfdist-nb panes: JupyterLab theme variables only, so light and dark themes both work. */

.tfdist-lab-panel {
  overflow: auto;
  padding: 8px 12px;
  font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
}

.tfdist-lab-header {
  display: flex;
  flex-wrap: wrap;
  gap: 8px;
  align-items: baseline;
  margin-bottom: 6px;
}

.tfdist-lab-id,
.tfdist-lab-cluster-id {
  font-weight: 600;
  font-family: var(--jp-code-font-family);
}

.tfdist-lab-note {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-state {
  border-radius: 3px;
  padding: 0 5px;
  font-size: var(--jp-ui-font-size0);
  text-transform: uppercase;
  background: var(--jp-layout-color3);
}

.tfdist-lab-state[data-state='live'] {
  background: var(--jp-success-color1);
  color: white;
}

.tfdist-lab-state[data-state='orphaned'],
.tfdist-lab-state[data-state='error'] {
  background: var(--jp-warn-color1);
  color: white;
}

.tfdist-lab-readonly .tfdist-lab-tasks,
.tfdist-lab-readonly .tfdist-lab-charts {
  opacity: 0.75;
}

.tfdist-lab-alerts {
  margin: 0 0 6px;
  padding: 0;
  list-style: none;
}

.tfdist-lab-alert {
  border-left: 3px solid var(--jp-warn-color1);
  padding: 2px 6px;
  margin: 2px 0;
  background: var(--jp-warn-color3);
}

.tfdist-lab-tasks {
  border-collapse: collapse;
  margin-bottom: 8px;
}

.tfdist-lab-tasks th,
.tfdist-lab-tasks td {
  padding: 2px 8px;
  text-align: right;
  border-bottom: 1px solid var(--jp-border-color2);
  white-space: nowrap;
}

.tfdist-lab-tasks th:first-child,
.tfdist-lab-tasks td:first-child,
.tfdist-lab-tasks td.tfdist-lab-task-state {
  text-align: left;
}

.tfdist-lab-task[data-state='dead'] td,
.tfdist-lab-straggler td {
  color: var(--jp-error-color1);
}

.tfdist-lab-swatch {
  display: inline-block;
  width: 8px;
  height: 8px;
  margin-right: 5px;
  border-radius: 2px;
}

.tfdist-lab-console-button {
  margin-left: 6px;
  padding: 0 4px;
  font-size: var(--jp-ui-font-size0);
}

.tfdist-lab-stream-input {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-legend-item {
  border-left: 10px solid;
  padding-left: 4px;
  margin-right: 10px;
}

.tfdist-lab-charts {
  display: grid;
  grid-template-columns: repeat(auto-fill, minmax(260px, 1fr));
  gap: 8px;
  margin: 6px 0 8px;
}

.tfdist-lab-chart-title {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-chart-body {
  height: 130px;
  border: 1px solid var(--jp-border-color2);
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-chart-empty {
  padding: 8px;
  font-size: var(--jp-ui-font-size0);
}

.tfdist-lab-svg {
  width: 100%;
  height: 100%;
}

.tfdist-lab-axis {
  stroke: var(--jp-border-color1);
  stroke-width: 1;
}

.tfdist-lab-floor {
  stroke: var(--jp-warn-color1, #ef6c00);
  stroke-width: 1;
  stroke-dasharray: 4 3;
  vector-effect: non-scaling-stroke;
}

.tfdist-lab-tick,
.tfdist-lab-empty {
  fill: var(--jp-ui-font-color2);
  font-size: 9px;
}

.tfdist-lab-line-path {
  fill: none;
  stroke-width: 1.5;
  vector-effect: non-scaling-stroke;
}

.tfdist-lab-filters {
  display: flex;
  gap: 6px;
  margin-bottom: 4px;
}

.tfdist-lab-filter-grep.tfdist-lab-bad {
  outline: 1px solid var(--jp-error-color1);
}

.tfdist-lab-log {
  height: 260px;
  overflow: auto;
  font-family: var(--jp-code-font-family);
  font-size: var(--jp-code-font-size);
  white-space: pre-wrap;
  border: 1px solid var(--jp-border-color2);
  padding: 4px;
}

.tfdist-lab-stream-stderr {
  color: var(--jp-error-color1);
}

.tfdist-lab-stream-note {
  color: var(--jp-ui-font-color2);
  font-style: italic;
}

.tfdist-lab-sidebar {
  padding: 6px;
  overflow: auto;
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size1);
}

.tfdist-lab-sidebar-head {
  display: flex;
  justify-content: space-between;
  align-items: center;
  font-weight: 600;
  margin-bottom: 4px;
}

.tfdist-lab-sidebar-status {
  color: var(--jp-ui-font-color2);
  margin-bottom: 4px;
}

.tfdist-lab-clusters {
  list-style: none;
  margin: 0;
  padding: 0;
}

.tfdist-lab-cluster {
  padding: 4px;
  border-bottom: 1px solid var(--jp-border-color2);
  cursor: pointer;
}

.tfdist-lab-cluster:hover {
  background: var(--jp-layout-color2);
}

.tfdist-lab-cluster > div:first-child {
  display: flex;
  gap: 6px;
  align-items: baseline;
}

.tfdist-lab-cluster-spec,
.tfdist-lab-cluster-tasks {
  color: var(--jp-ui-font-color2);
}

.tfdist-lab-alert-count {
  color: var(--jp-warn-color1);
}

.tfdist-lab-opener {
  padding: 2px 0;
}
`,""]),r.d(e,{},{A:i})},"./node_modules/css-loader/dist/runtime/api.js"(t){t.exports=function(t){var e=[];return e.toString=function(){return this.map(function(e){var r="",o=void 0!==e[5];return e[4]&&(r+="@supports (".concat(e[4],") {")),e[2]&&(r+="@media ".concat(e[2]," {")),o&&(r+="@layer".concat(e[5].length>0?" ".concat(e[5]):""," {")),r+=t(e),o&&(r+="}"),e[2]&&(r+="}"),e[4]&&(r+="}"),r}).join("")},e.i=function(t,r,o,a,s){"string"==typeof t&&(t=[[null,t,void 0]]);var i={};if(o)for(var n=0;n<this.length;n++){var l=this[n][0];null!=l&&(i[l]=!0)}for(var d=0;d<t.length;d++){var c=[].concat(t[d]);o&&i[c[0]]||(void 0!==s&&(void 0===c[5]||(c[1]="@layer".concat(c[5].length>0?" ".concat(c[5]):""," {").concat(c[1],"}")),c[5]=s),r&&(c[2]&&(c[1]="@media ".concat(c[2]," {").concat(c[1],"}")),c[2]=r),a&&(c[4]?(c[1]="@supports (".concat(c[4],") {").concat(c[1],"}"),c[4]=a):c[4]="".concat(a)),e.push(c))}},e}},"./node_modules/css-loader/dist/runtime/noSourceMaps.js"(t){t.exports=function(t){return t[1]}},"./node_modules/style-loader/dist/runtime/injectStylesIntoStyleTag.js"(t){var e=[];function r(t){for(var r=-1,o=0;o<e.length;o++)if(e[o].identifier===t){r=o;break}return r}function o(t,o){for(var a={},s=[],i=0;i<t.length;i++){var n=t[i],l=o.base?n[0]+o.base:n[0],d=a[l]||0,c="".concat(l," ").concat(d);a[l]=d+1;var p=r(c),f={css:n[1],media:n[2],sourceMap:n[3],supports:n[4],layer:n[5]};if(-1!==p)e[p].references++,e[p].updater(f);else{var u=function(t,e){var r=e.domAPI(e);return r.update(t),function(e){e?(e.css!==t.css||e.media!==t.media||e.sourceMap!==t.sourceMap||e.supports!==t.supports||e.layer!==t.layer)&&r.update(t=e):r.remove()}}(f,o);o.byIndex=i,e.splice(i,0,{identifier:c,updater:u,references:1})}s.push(c)}return s}t.exports=function(t,a){var s=o(t=t||[],a=a||{});return function(t){t=t||[];for(var i=0;i<s.length;i++){var n=r(s[i]);e[n].references--}for(var l=o(t,a),d=0;d<s.length;d++){var c=r(s[d]);0===e[c].references&&(e[c].updater(),e.splice(c,1))}s=l}}},"./node_modules/style-loader/dist/runtime/insertBySelector.js"(t){var e={};t.exports=function(t,r){var o=function(t){if(void 0===e[t]){var r=document.querySelector(t);if(window.HTMLIFrameElement&&r instanceof window.HTMLIFrameElement)try{r=r.contentDocument.head}catch(t){r=null}e[t]=r}return e[t]}(t);if(!o)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");o.appendChild(r)}},"./node_modules/style-loader/dist/runtime/insertStyleElement.js"(t){t.exports=function(t){var e=document.createElement("style");return t.setAttributes(e,t.attributes),t.insert(e,t.options),e}},"./node_modules/style-loader/dist/runtime/setAttributesWithoutAttributes.js"(t,e,r){t.exports=function(t){var e=r.nc;e&&t.setAttribute("nonce",e)}},"./node_modules/style-loader/dist/runtime/styleDomAPI.js"(t){t.exports=function(t){if("u"<typeof document)return{update:function(){},remove:function(){}};var e=t.insertStyleElement(t);return{update:function(r){var o,a,s;o="",r.supports&&(o+="@supports (".concat(r.supports,") {")),r.media&&(o+="@media ".concat(r.media," {")),(a=void 0!==r.layer)&&(o+="@layer".concat(r.layer.length>0?" ".concat(r.layer):""," {")),o+=r.css,a&&(o+="}"),r.media&&(o+="}"),r.supports&&(o+="}"),(s=r.sourceMap)&&"u">typeof btoa&&(o+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(s))))," */")),t.styleTagTransform(o,e,t.options)},remove:function(){var t;null===(t=e).parentNode||t.parentNode.removeChild(t)}}}},"./node_modules/style-loader/dist/runtime/styleTagTransform.js"(t){t.exports=function(t,e){if(e.styleSheet)e.styleSheet.cssText=t;else{for(;e.firstChild;)e.removeChild(e.firstChild);e.appendChild(document.createTextNode(t))}}},"./style/index.js"(t,e,r){var o=r("./node_modules/style-loader/dist/runtime/injectStylesIntoStyleTag.js"),a=r.n(o),s=r("./node_modules/style-loader/dist/runtime/styleDomAPI.js"),i=r.n(s),n=r("./node_modules/style-loader/dist/runtime/insertBySelector.js"),l=r.n(n),d=r("./node_modules/style-loader/dist/runtime/setAttributesWithoutAttributes.js"),c=r.n(d),p=r("./node_modules/style-loader/dist/runtime/insertStyleElement.js"),f=r.n(p),u=r("./node_modules/style-loader/dist/runtime/styleTagTransform.js"),b=r.n(u),m=r("./node_modules/css-loader/dist/cjs.js!./style/base.css"),v={};v.styleTagTransform=b(),v.setAttributes=c(),v.insert=l().bind(null,"head"),v.domAPI=i(),v.insertStyleElement=f(),a()(m.A,v),m.A&&m.A.locals&&m.A.locals}}]);